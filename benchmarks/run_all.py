"""Run every workload and print one table of figures, targets and references.

Each workload runs in a fresh interpreter (``multiprocessing`` spawn), so its
peak RSS is its own and no workload warms the caches of the next. W4 comes
from ``w4_actor_roundtrip.main()``, which a colleague maintains; when that
module is missing the table says so and the other workloads still run.

Run: ``python benchmarks/run_all.py [--backend trio] [--repetitions N]
[--only w1,w3]``
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import multiprocessing
import os
import platform
from concurrent.futures import ProcessPoolExecutor
from datetime import date

from _common import JOURNAL, METRICS, add_options

WORKLOADS = {
    "w1": "w1_replan_loop",
    "w2": "w2_fanout",
    "w3": "w3_concurrent_runs",
    "w4": "w4_actor_roundtrip",
}
W4_MODULE = WORKLOADS["w4"]


def run_workload(
    module: str, backend: str, repetitions: int | None, synchronous: str = "NORMAL"
) -> dict[str, float]:
    """Import a workload and run its ``main`` (in a child process)."""
    JOURNAL["synchronous"] = synchronous
    workload = importlib.import_module(module)
    if module == W4_MODULE:
        # Its main() takes no options and measures both backends.
        return _w4_figures(workload.main(), backend)
    figures: dict[str, float] = workload.main(backend=backend, repetitions=repetitions)
    return figures


def _w4_figures(figures: dict[str, float], backend: str) -> dict[str, float]:
    """Pick the msg/s figure for ``backend`` out of W4's own keys."""
    rates = {k: v for k, v in figures.items() if k.endswith("msg_per_s")}
    chosen = next((v for k, v in rates.items() if backend in k), None)
    if chosen is None and rates:
        chosen = next(iter(rates.values()))
    return {} if chosen is None else {"w4_msg_per_s": chosen}


def measure(
    name: str, backend: str, repetitions: int | None, synchronous: str = "NORMAL"
) -> dict[str, float] | str:
    """The workload's figures, or why there are none."""
    module = WORKLOADS[name]
    if importlib.util.find_spec(module) is None:
        return f"{module}.py not found: skipped"
    print(f"--- {name}: {module} ({backend})", flush=True)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        try:
            return pool.submit(
                run_workload, module, backend, repetitions, synchronous
            ).result()
        except Exception as exc:
            return f"failed: {type(exc).__name__}: {exc}"


REFERENCE_HEADER = "anyio / AutoGen / LangGraph"


def table(results: dict[str, dict[str, float] | str], backend: str) -> str:
    """The figures as a fixed-width table, one metric per line."""
    rows = [("figure", "measured", "target", "met", REFERENCE_HEADER)]
    for name, outcome in results.items():
        metrics = [m for m in METRICS.values() if m.key.startswith(f"{name}_")]
        if isinstance(outcome, str):
            rows.append((metrics[0].label, outcome, "", "", ""))
            continue
        for metric in metrics:
            value = outcome.get(metric.key)
            refs = (
                " / ".join((metric.anyio_ref, metric.autogen_ref, metric.langgraph_ref))
                if metric.anyio_ref
                else ""
            )
            rows.append(
                (
                    metric.label,
                    "missing" if value is None else metric.show(value),
                    metric.target_text(),
                    "" if value is None else metric.verdict(value),
                    refs,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(width) for cell, width in zip(row, widths, strict=True)
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    machine = (
        f"{date.today().isoformat()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {backend}"
    )
    return "\n".join([f"replan benchmarks ({machine})", *lines])


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(parser)
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help="comma-separated workloads to run (default: all)",
    )
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    results = {
        name: measure(name, args.backend, args.repetitions, args.synchronous)
        for name in chosen
    }
    print()
    if args.synchronous != "NORMAL":
        print(f"journal: synchronous={args.synchronous} (the targets are for NORMAL)")
    print(table(results, args.backend))
    figures: dict[str, float] = {}
    for outcome in results.values():
        if not isinstance(outcome, str):
            figures.update(outcome)
    return figures


if __name__ == "__main__":
    main()
