"""Card numbers: 13-19 digits with a known issuer prefix and a valid Luhn sum; in text, written
in at most ``MAX_GROUPS`` groups separated by a space or a dash (``4111 1111 1111 1111``,
``3782-822463-10005``, ``6759 6498 2643 8453 0``).

The group limit is what keeps a long run of digit groups cheap: from each group, only the
windows of up to five groups are candidates; a start whose five groups hold fewer than 13
digits is skipped without a look at its digits, and a run without a group of three digits
(``4 4 4 4 ...``) holds no card at all (13 digits in five groups need one).
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, compress, repeat

MAX_GROUPS = 5
_SHORTEST, _LONGEST = 13, 19
_SEPARATORS = str.maketrans("-", " ")
_THREE_DIGITS = re.compile("[0-9]{3}")
# Visa, Mastercard (51-55, 2221-2720), American Express (34, 37), Discover and UnionPay
# (6...), Diners Club (300-305, 36, 38, 39), JCB (3528-3589), Mir (2200-2204), Maestro (50-58).
_ISSUER = re.compile(
    r"4|6|5[0-8]|3[46-9]|30[0-5]|35(?:2[89]|[3-8])|220[0-4]|222[1-9]|22[3-9]|2[3-6]|27[01]|2720"
)
_DOUBLED = str.maketrans("0123456789", "0246813579")  # 2d, less 9 past 9: Luhn's doubling


def is_card_number(digits: str) -> bool:
    """``digits`` (digits only) is a card number: length, issuer prefix and Luhn sum."""
    return (
        _SHORTEST <= len(digits) <= _LONGEST and _ISSUER.match(digits) is not None and _luhn(digits)
    )


def redact_cards(run: str) -> str:
    """A run of digit groups with every card in it replaced: from each group on, the longest
    card is taken, so a number written next to a card ("4111 1111 1111 1111 2 items") does
    not hide it."""
    if _THREE_DIGITS.search(run) is None:
        return run
    groups = run.translate(_SEPARATORS).split(" ")
    count = len(groups)
    before = list(accumulate(map(len, groups), initial=0))  # digits before each group
    # Candidate starts, chosen without a Python step per group: the next five groups hold 13
    # digits or more, and the digits from there start with an issuer's prefix.
    window_ends = before[MAX_GROUPS:count] + [before[count]] * min(MAX_GROUPS, count)
    long_enough = map((_SHORTEST - 1).__lt__, map(operator.sub, window_ends, before))
    issued = map(operator.truth, map(_ISSUER.match, repeat("".join(groups)), before[:count]))
    starts = compress(range(count), map(operator.and_, long_enough, issued))
    out: list[str] = []
    done = 0  # groups replaced or passed
    written = 0  # characters of the run written out
    for start in starts:
        if start < done or (end := _longest_card(groups, before, start)) is None:
            continue
        # Group g starts at before[g] + g in the run: one separator after each group.
        out += (run[written : before[start] + start], "[REDACTED:card]")
        done, written = end, before[end] + end - 1
    if not out:
        return run
    out.append(run[written:])
    return "".join(out)


def _longest_card(groups: list[str], before: list[int], start: int) -> int | None:
    """The end (exclusive) of the longest card of up to ``MAX_GROUPS`` groups from ``start``."""
    for end in range(min(start + MAX_GROUPS, len(groups)), start, -1):
        length = before[end] - before[start]
        if length < _SHORTEST:
            return None
        if length <= _LONGEST and is_card_number("".join(groups[start:end])):
            return end
    return None


def _luhn(digits: str) -> bool:
    # From the right: every other digit as it is, the others doubled (their digit sums).
    kept = digits[-1::-2].encode()
    doubled = digits[-2::-2].translate(_DOUBLED).encode()
    return (sum(kept) + sum(doubled) - 48 * len(digits)) % 10 == 0
