"""Instructions per W1 run, counted by callgrind: a figure the machine's load
cannot move.

Wall time on this shared 2-core machine swings by 10-50 % between two runs
of the same code, more than most single changes to replan move it. The
number of instructions a W1 run executes does not: two counts of the same
code agree to about 0.1 % (the worst seen, 0.6 %). Use this script to
compare two versions of the code; use the wall-time scripts for the figures
the targets speak of.

What is counted: the W1 run (``w1_replan_loop.py``'s spec and scripted
model), steady state: one supervisor and one journal serve the runs one
after another. The script runs the workload twice under
``valgrind --tool=callgrind``, at the same time (one per core): once with
``--warm`` runs, once with ``--warm`` + ``--runs`` runs. The difference of the
two totals, divided by ``--runs``, is one run's instructions, with the
interpreter's start, the imports and the warm-up cancelled out. Every run is
checked as W1 checks it. ``PYTHONHASHSEED=0`` keeps set and dict layouts
the same from one count to the next.

Kernel time (SQLite's ``pwrite`` and ``fcntl`` calls) is not counted:
``--store memory`` against the default SQLite journal shows what the
journal costs in user-space instructions alone.

Needs valgrind (``apt install valgrind``); takes about 40 seconds on two cores.

Run: ``python benchmarks/instructions.py [--store memory] [--runs 40]
[--backend trio]``
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import anyio
from _common import (
    BACKENDS,
    W1_TASKS,
    BenchModel,
    check_replan_loop,
    replan_loop_model,
    replan_loop_spec,
    report,
    sqlite_journal,
)

from replan import Supervisor
from replan.store import MemoryStore, Store

STORES = ("sqlite", "memory")
WARM_RUNS = 20
COUNTED_RUNS = 40

_REFS = re.compile(r"refs:\s*([\d,]+)")


class CountFailed(RuntimeError):
    """A counting run under valgrind did not finish as intended."""


# The workload, run in the child process under valgrind ---------------------------


async def _runs(count: int, store_kind: str) -> None:
    """Run W1 ``count`` times, one run after another, on one supervisor."""
    spec = replan_loop_spec()
    model = BenchModel(replan_loop_model)

    async def serve(store: Store) -> None:
        async with Supervisor(model=model, store=store) as sup:
            for _ in range(count):
                check_replan_loop(await (await sup.submit(spec)).result())

    if store_kind == "memory":
        await serve(MemoryStore())
    else:
        async with sqlite_journal() as store:
            await serve(store)


# Counting --------------------------------------------------------------------------


def _command(runs: int, store: str, backend: str, out_file: str) -> list[str]:
    valgrind = shutil.which("valgrind")
    assert valgrind is not None
    return [
        valgrind,
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        sys.executable,
        os.path.abspath(__file__),
        "--child-runs",
        str(runs),
        "--store",
        store,
        "--backend",
        backend,
    ]


def _total(process: subprocess.Popen[str], runs: int) -> int:
    """Wait for one counting process; its total instruction count."""
    _, stderr = process.communicate()
    if process.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise CountFailed(
            f"the count of {runs} runs exited with {process.returncode}:\n{tail}"
        )
    match = _REFS.search(stderr)
    if match is None:
        raise CountFailed(f"valgrind printed no instruction total for {runs} runs")
    return int(match.group(1).replace(",", ""))


def count(store: str, backend: str, runs: int, warm: int) -> float:
    """Instructions of one W1 run (``runs`` counted after ``warm`` runs)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory(prefix="replan-callgrind-") as directory:
        processes = [
            (
                n,
                subprocess.Popen(
                    _command(n, store, backend, os.path.join(directory, f"cg.{n}")),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
            for n in (warm, warm + runs)
        ]
        try:
            base, counted = (_total(process, n) for n, process in processes)
        finally:
            for _, process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return (counted - base) / runs


def main(
    store: str = "sqlite",
    backend: str = "asyncio",
    runs: int = COUNTED_RUNS,
    warm: int = WARM_RUNS,
) -> dict[str, float]:
    """Count, print and return the figures."""
    if shutil.which("valgrind") is None:
        raise CountFailed(
            "valgrind is not installed (instructions.py counts with its "
            "callgrind tool): install it, e.g. `apt install valgrind`"
        )
    per_run = count(store, backend, runs, warm)
    figures = {
        "callgrind_w1_minstr_per_run": per_run / 1e6,
        "callgrind_w1_kinstr_per_step": per_run / 1e3 / W1_TASKS,
    }
    print(
        f"W1 instructions ({store} journal, {backend}; {runs} runs counted "
        f"after {warm}, PYTHONHASHSEED=0)"
    )
    report(figures)
    return figures


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="W1: instructions per run, counted under valgrind's callgrind"
    )
    parser.add_argument("--backend", choices=BACKENDS, default="asyncio")
    parser.add_argument(
        "--store",
        choices=STORES,
        default="sqlite",
        help="the journal: SQLite in a temporary directory (default) or memory",
    )
    parser.add_argument(
        "--runs",
        type=_positive,
        default=COUNTED_RUNS,
        help=f"runs counted (default {COUNTED_RUNS})",
    )
    parser.add_argument(
        "--warm",
        type=_positive,
        default=WARM_RUNS,
        help=f"warm-up runs, not counted (default {WARM_RUNS})",
    )
    # The workload itself, as the counting processes run it.
    parser.add_argument("--child-runs", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_runs is not None:
        anyio.run(_runs, args.child_runs, args.store, backend=args.backend)
        return 0
    try:
        main(store=args.store, backend=args.backend, runs=args.runs, warm=args.warm)
    except CountFailed as exc:
        print(f"instructions.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
