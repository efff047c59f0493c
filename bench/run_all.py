"""``make bench``: every benchmark in turn; each prints its figures and appends them to
docs/benchmarks.md. A benchmark whose service or tool is missing is skipped with the reason.

    python -m bench.run_all [ingest replica_ack pipeline overhead cost_per_event statement_cost
                             claude_client
                             prompt_size chaos capacity shadow relay_scale alert_storm]
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback

from bench.common import Skip

BENCHMARKS = [
    "ingest",
    "replica_ack",
    "pipeline",
    "overhead",
    "cost_per_event",
    "statement_cost",
    "claude_client",
    "prompt_size",
    "chaos",
    "capacity",
    "shadow",
    "relay_scale",
    "alert_storm",
]


def main() -> int:
    chosen = sys.argv[1:] or BENCHMARKS
    failed: list[str] = []
    for name in chosen:
        module_name = f"bench.{name}"
        if importlib.util.find_spec(module_name) is None:
            print(f"== {name}: skipped (no {module_name} module in this checkout)", flush=True)
            continue
        print(f"== {name}", flush=True)
        sys.argv = [module_name]  # each benchmark runs with its defaults
        try:
            importlib.import_module(module_name).main()
        except Skip as exc:
            print(f"== {name}: skipped: {exc}", flush=True)
        except Exception:  # noqa: BLE001 - report it, run the next benchmark
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"== failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
