"""W5: runs submitted over HTTP to one daemon — submission rate, completion, memory.

What is measured: ``replan serve`` started as a subprocess on 127.0.0.1 with
the demo's scripted model (``--model scripted:demo``), every model call
sleeping ``--latency`` seconds (default 20 ms), retention off, and 256
workers per role. The client submits ``--runs`` runs (default 1,000) of the
demo goal over HTTP, one after the other on one keep-alive connection, with
``gate_policy.gate_on = []`` so the demo's scope-shift replan applies without
a person (each run: first plan, 5 task executions, 1 review by the model, 1
replan with its alignment check, synthesis: 10 model calls). Figures:

* submission rate: runs accepted (202) per second, first POST to last;
* time until all complete: first POST until ``GET /v1/runs`` shows no run
  running (polled every 100 ms);
* peak RSS of the daemon process (``VmHWM`` from ``/proc``, Linux);
* journal bytes per run: the SQLite file and its WAL after all runs ended,
  divided by the runs.

Checked: every run ended ``completed`` with one applied replan. uvicorn runs
on asyncio only, so ``--backend`` does not apply; one repetition (a fresh
daemon and journal), since one round of 1,000 runs takes tens of seconds.

Run: ``python benchmarks/w5_daemon.py [--runs 1000] [--latency 0.02]``
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "benchmark-token-0123456789"
ROLES = ("planner", "executor", "reviewer", "ranker", "evolver", "human_gate")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(runs: int = 1000, latency_s: float = 0.02) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="replan-w5-") as directory:
        data = Path(directory)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAN_")}
        env["REPLAN_API_TOKEN"] = TOKEN
        command = [
            sys.executable,
            "-m",
            "replan",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--model-latency",
            str(latency_s),
            "--retention",
            "off",
            "--log-level",
            "warning",
            *(arg for role in ROLES for arg in ("--workers", f"{role}=256")),
        ]
        daemon = subprocess.Popen(command, env=env)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                _wait_ready(client)
                body = {
                    "goal": "benchmark: explain efficient sequence modelling",
                    "gate_policy": {"gate_on": []},
                }
                started = time.perf_counter()
                run_ids = []
                for _ in range(runs):
                    response = client.post("/v1/runs", json=body)
                    response.raise_for_status()
                    run_ids.append(response.json()["run_id"])
                submitted = time.perf_counter()
                while client.get(
                    "/v1/runs",
                    params={"status": ["running", "waiting_for_human"], "limit": 1},
                ).json()["runs"]:
                    time.sleep(0.1)
                finished = time.perf_counter()
                peak = _peak_rss_mib(daemon.pid)
                _check(client, run_ids)
            journal = sum(
                p.stat().st_size for p in data.glob("journal.db*") if p.is_file()
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(60)
        if code != 0:
            raise AssertionError(f"the daemon exited {code} after SIGTERM")
    figures = {
        "w5_runs": float(runs),
        "w5_submissions_per_s": runs / (submitted - started),
        "w5_all_complete_s": finished - started,
        "w5_daemon_peak_rss_mib": peak,
        "w5_journal_kib_per_run": journal / 1024 / runs,
    }
    for key, value in figures.items():
        print(f"  {key:<26} {value:,.2f}")
    return figures


def _wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the daemon did not get ready")


def _check(client: httpx.Client, run_ids: list[str]) -> None:
    problems = []
    for run_id in run_ids:
        run = client.get(f"/v1/runs/{run_id}").json()
        replans = run["result"]["replans"]
        if run["status"] != "completed" or [r["outcome"] for r in replans] != [
            "applied"
        ]:
            problems.append(f"{run_id}: {run['status']} {run['result']['stop_reason']}")
    if problems:
        raise AssertionError(f"{len(problems)} runs went wrong: {problems[:3]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    main(runs=args.runs, latency_s=args.latency)
