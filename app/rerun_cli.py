"""``eventgate replay``, ``eventgate consistency`` and ``eventgate eval``: events decided again,
nothing published (``app/reruns.py``). Each prints the figures, and with ``--json`` one JSON
object as the last line of stdout. Replay and consistency exit 0 once they ran, whatever the
agreement, and 1 when an event got no decision (each is an ``error:`` line, and in
``errors``); eval exits 1 when a case's pass rate is below ``--min-pass``; 2 is a usage error."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from app.config import ConfigError, GatewayConfig, load_config
from app.config_yaml import UnsafeYaml, read_yaml
from app.evaluate.evals import EvalFileError, parse_cases
from app.observability.logging import configure_logging
from app.reruns import RerunRefused, Selection
from app.reruns import consistency as run_consistency
from app.reruns import evaluate as run_evaluate
from app.reruns import replay as run_replay
from app.settings import Settings

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", envvar="EVENTGATE_CONFIG", help="YAML config file."),
]
PipelineOpt = Annotated[str, typer.Option("--pipeline", help="the pipeline that decides again")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="events received at or after (ISO 8601, UTC)")
]
UntilOpt = Annotated[str | None, typer.Option("--until", help="events received before (ISO)")]
SourceOpt = Annotated[str | None, typer.Option("--source", help="only this source's events")]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object as the last line")]


def _when(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        # In UTC: SQLite compares the stored text, which drops an offset without applying it.
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        typer.echo(f"{option}: not an ISO 8601 time: {text!r}", err=True)
        raise typer.Exit(2) from None


def _setup(config: Path | None) -> tuple[Settings, GatewayConfig]:
    settings = Settings(config=config)
    configure_logging(fmt=settings.log_format, level="WARNING")
    try:
        return settings, load_config(settings.config)
    except ConfigError as exc:
        typer.echo(f"config error: {exc}", err=True)
        raise typer.Exit(2) from None


def _share(value: float | None) -> str:
    return "n/a (nothing compared)" if value is None else f"{value:.2f}"


def _lines(found: dict[str, Any]) -> list[str]:
    lines = [
        f"events: {found['events']} ({found['pairs']} pairs compared)",
        f"action agreement: {_share(found['action_agreement'])}",
        f"exact agreement: {_share(found['exact_agreement'])}",
        f"group id agreement: {_share(found['group_id_agreement'])}",
    ]
    lines += [f"  {name}: {_share(share)}" for name, share in found["fields"].items()]
    lines += [f"cost (USD): {json.dumps(found['cost_usd'])}"]
    lines += [f"error: {e['event_id']}: {e['error']}" for e in found["errors"]]
    return lines


def _calls(decision: list[dict[str, Any]]) -> str:
    shown = [f"{c['tool']} {json.dumps(c['input'], sort_keys=True)}" for c in decision]
    return "<br>".join(shown).replace("|", "\\|") or "(no tool call)"


def _markdown(found: dict[str, Any], title: str) -> str:
    rows = [
        f"| {d['event_id']} | {_calls(d['baseline'])} | {_calls(d['candidate'])} |"
        for d in found["disagreements"]
    ]
    return "\n".join(
        [
            f"# {title}",
            "",
            *(f"- {line}" for line in _lines(found)),
            "",
            "## Disagreements",
            "",
            "| event | baseline | candidate |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def _run(work: Any) -> dict[str, Any]:
    try:
        return dict(asyncio.run(work))
    except RerunRefused as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(2) from None


def replay(
    pipeline: PipelineOpt,
    since: SinceOpt = None,
    until: UntilOpt = None,
    source: SourceOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many events")] = 100,
    report: Annotated[
        Path | None, typer.Option("--report", help="write the figures and disagreements here")
    ] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Decide stored events again through PIPELINE, publishing nothing, against what was
    decided live: agreement, cost of each side, the disagreements."""
    settings, gateway = _setup(config)
    selection = Selection(_when(since, "--since"), _when(until, "--until"), source, limit)
    if report is not None:
        try:
            report.touch()  # before the calls are paid for, not after
        except OSError as exc:
            typer.echo(f"--report: cannot write the report: {exc}", err=True)
            raise typer.Exit(2) from None
    found = _run(run_replay(settings, gateway, pipeline=pipeline, selection=selection))
    typer.echo(f"replay through {pipeline} against live")
    for line in _lines(found):
        typer.echo(line)
    if report is not None:
        report.write_text(_markdown(found, f"Replay through {pipeline} against live"))
        typer.echo(f"report: {report}")
    if as_json:
        typer.echo(json.dumps(found, sort_keys=True))
    if found["errors"]:
        raise typer.Exit(1)


def consistency(
    pipeline: PipelineOpt,
    since: SinceOpt = None,
    until: UntilOpt = None,
    source: SourceOpt = None,
    events: Annotated[int, typer.Option("--events", min=1, help="stored events to run")] = 20,
    runs: Annotated[int, typer.Option("--runs", min=2, help="runs of each event")] = 5,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Run stored events RUNS times each through PIPELINE, publishing nothing, and say how
    often the runs of one event agree."""
    settings, gateway = _setup(config)
    selection = Selection(_when(since, "--since"), _when(until, "--until"), source, events)
    found = _run(
        run_consistency(settings, gateway, pipeline=pipeline, selection=selection, runs=runs)
    )
    typer.echo(f"consistency of {pipeline}: {runs} runs per event")
    for line in _lines(found):
        typer.echo(line)
    typer.echo(f"tokens: {json.dumps(found['tokens'])}")
    if as_json:
        typer.echo(json.dumps(found, sort_keys=True))
    if found["errors"]:
        raise typer.Exit(1)


def eval_cases(
    file: Annotated[Path, typer.Argument(help="the eval file (YAML): cases and expectations")],
    pipeline: Annotated[
        str | None, typer.Option("--pipeline", help="run every case through this pipeline")
    ] = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="runs of each case")] = 1,
    min_pass: Annotated[
        float, typer.Option("--min-pass", min=0.0, max=1.0, help="each case's pass rate")
    ] = 1.0,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Run each case of FILE RUNS times (publishing nothing); exit 1 when any case passes
    less often than --min-pass, so a prompt or model change can be gated in CI."""
    settings, gateway = _setup(config)
    try:
        document = read_yaml(file.read_text())
        cases = parse_cases(document, gateway, pipeline=pipeline)
    except (OSError, UnsafeYaml, yaml.YAMLError, EvalFileError, ValueError) as exc:
        typer.echo(f"{file}: {exc}", err=True)
        raise typer.Exit(2) from None
    found = _run(run_evaluate(settings, gateway, cases=cases, runs=runs, min_pass=min_pass))
    for case in found["cases"]:
        verdict = "ok  " if case["pass_rate"] >= min_pass else "FAIL"
        typer.echo(f"{verdict} {case['pass_rate']:.2f} {case['name']} ({case['pipeline']})")
        for failure in case["failures"]:
            typer.echo(f"       {failure}")
    typer.echo(
        f"{len(cases)} cases, {runs} run(s) each: pass rate {found['pass_rate']:.2f}, "
        f"exact agreement between runs {_share(found['exact_agreement'])}"
    )
    if as_json:
        typer.echo(json.dumps(found, sort_keys=True))
    if not found["passed"]:
        raise typer.Exit(1)
