"""What a Claude call cost, from a configurable price table (USD per million tokens).

Cache writes and cache reads have their own prices: a repeated pipeline whose system prompt
and tools are cached pays the cache-read price for that prefix. ``config.models.<m>.price``
overrides the built-in table; a model found in neither costs 0.0 and is logged once. A call
made through the Message Batches API costs half (``batch=True``).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from app.config import GatewayConfig

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def total(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


# Anthropic list prices (5-minute cache writes). Keys match model ids by prefix, and Bedrock
# ids ("us.anthropic.claude-sonnet-4-5-20250929-v1:0") by the part after "anthropic.".
DEFAULT_PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
}

# The Message Batches API bills 50% of the standard price, input and output alike: its batch
# prices are half the standard ones (https://docs.anthropic.com/en/docs/build-with-claude/
# batch-processing, "Pricing"). Cache writes and reads are multiples of the input price, so
# they are halved with it.
BATCH_DISCOUNT = 0.5


class PriceTable:
    def __init__(self, prices: dict[str, Price]) -> None:
        # Longest key first, so "claude-opus-4-1" wins over "claude-opus-4".
        self._prices = dict(sorted(prices.items(), key=lambda kv: -len(kv[0])))
        self._unknown: set[str] = set()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> PriceTable:
        prices = dict(DEFAULT_PRICES)
        for name, model in config.models.items():
            if model.price is not None:
                p = model.price
                prices[name] = Price(p.input, p.output, p.cache_write, p.cache_read)
        return cls(prices)

    def price_of(self, model: str) -> Price | None:
        name = model.split("anthropic.", 1)[-1]
        for key, price in self._prices.items():
            if name == key or name.startswith(key):
                return price
        return None

    def cost_usd(self, model: str, usage: Usage, *, batch: bool = False) -> float:
        price = self.price_of(model)
        if price is None:
            if model not in self._unknown:
                self._unknown.add(model)
                log.warning("llm_price_unknown", model=model, detail="cost counted as 0")
            return 0.0
        micro = (
            usage.input_tokens * price.input
            + usage.output_tokens * price.output
            + usage.cache_creation_input_tokens * price.cache_write
            + usage.cache_read_input_tokens * price.cache_read
        )
        if batch:
            micro *= BATCH_DISCOUNT
        return round(micro / 1_000_000, 8)


def unknown_models(config: GatewayConfig) -> list[str]:
    """Warnings for the pipelines' models that have no price, built in or configured: a typo
    in a model id is caught before Claude refuses it, a new model is still allowed (its cost
    counts as 0 until ``models.<id>.price`` is set)."""
    table = PriceTable.from_config(config)
    warnings = []
    for name, pipeline in config.pipelines.items():
        for key, model in (("model", pipeline.model), ("fallback_model", pipeline.fallback_model)):
            if model is not None and table.price_of(model) is None:
                warnings.append(
                    f"pipelines.{name}.{key}: unknown model {model!r} (not in the price table;"
                    f" its cost counts as 0): check the id, or set models.{model}.price"
                )
    return warnings
