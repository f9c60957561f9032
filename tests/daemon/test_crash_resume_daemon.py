"""The daemon killed (SIGKILL) at random moments of a run and started again
each time finishes the run once, losing and repeating nothing (the run is
tests/supervisor/crash_worker.py's ``SPEC``)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import httpx
from daemon_process import HERE, DaemonProcess

from replan.store import SQLiteStore, ToolEffectRecord

SUPERVISOR_TESTS = HERE.parent / "supervisor"
MODEL = (
    "--model",
    "python:crash_worker:daemon_model",
    "--tool",
    "crash_worker:send_email",
)
SPEC = {
    "goal": "map the market for solid-state batteries",
    "tasks": [
        {"key": "s1", "description": "email ana the outline"},
        {"key": "s2", "description": "survey the makers"},
        {"key": "s3", "description": "size the market", "depends_on": ["s1", "s2"]},
        {"key": "s4", "description": "price the cells", "depends_on": ["s3"]},
        {"key": "s5", "description": "rank the makers", "depends_on": ["s3"]},
    ],
    "limits": {"max_concurrency": 3, "milestone_every": 100, "max_task_attempts": 3},
}
KEYS = ["s1", "s2", "s3", "s4", "s5", "r1", "r2", "r3", "q1", "q2"]
LIVES = 8


def approve_open_gates(client: httpx.Client) -> None:
    for gate in client.get("/v1/gates").json()["gates"]:
        # 409 for a gate answered meanwhile: the run went on.
        client.post(f"/v1/gates/{gate['gate_id']}", json={"decision": "approve"})


def journal(data: Path, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with closing(sqlite3.connect(data / "journal.db")) as conn:
        rows = conn.execute(
            "SELECT type, payload FROM events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
    return [(kind, json.loads(payload)) for kind, payload in rows]


def emails_returned(data: Path, run_id: str) -> set[str]:
    """Keys of the side-effect calls the ledger knows returned."""

    async def read() -> list[ToolEffectRecord]:
        async with SQLiteStore(data / "journal.db", read_only=True) as store:
            return await store.read_tool_effects(run_id)

    return {r.key for r in anyio.run(read) if r.content is not None}


def sent(outbox: Path) -> Counter[str]:
    lines = outbox.read_text().splitlines() if outbox.exists() else []
    return Counter(line.split(" ", 1)[1] for line in lines)


def test_a_daemon_killed_at_random_moments_finishes_the_run_once(
    tmp_path: Path,
) -> None:
    data, outbox = tmp_path / "data", tmp_path / "outbox"
    env = {
        "REPLAN_TEST_OUTBOX": str(outbox),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(SUPERVISOR_TESTS)]),
    }
    moments = random.Random(20261127)
    run_id = ""
    # Emails the ledger knew had been sent at a kill, and how many went by then.
    sent_at_kill: dict[str, int] = {}
    view: dict[str, Any] = {}
    for life in range(1, LIVES + 1):
        daemon = DaemonProcess(data, *MODEL, env=env).start()
        last = life == LIVES
        try:
            with daemon.client() as client:
                if not run_id:
                    response = client.post("/v1/runs", json=SPEC)
                    assert response.status_code == 202, response.text
                    run_id = response.json()["run_id"]
                until = time.monotonic() + (30 if last else moments.uniform(0.05, 0.3))
                while time.monotonic() < until:
                    approve_open_gates(client)
                    view = client.get(f"/v1/runs/{run_id}").json()
                    if view["status"] not in ("running", "waiting_for_human"):
                        break
                    time.sleep(0.01)
            if not last:
                daemon.kill()
                went = sent(outbox)
                for key in emails_returned(data, run_id):
                    sent_at_kill.setdefault(key, went[key])
        finally:
            daemon.close()
        if view.get("status") == "completed":
            break
    assert view["status"] == "completed", daemon.output()
    tasks = view["result"]["tasks"]
    assert [t["key"] for t in tasks] == KEYS
    assert {t["status"] for t in tasks} == {"completed"}
    assert [r["outcome"] for r in view["result"]["replans"]] == ["applied"] * 2
    events = journal(data, run_id)
    kinds = Counter(kind for kind, _ in events)
    assert kinds["run_finished"] == 1
    assert events[-1][0] == "run_finished"
    assert kinds["replan_applied"] == 2
    succeeded = Counter(
        e["task_id"]
        for kind, e in events
        if kind == "task_finished" and e["outcome"]["success"]
    )
    assert succeeded == Counter({t["id"]: 1 for t in tasks})
    resolved = Counter(e["gate_id"] for kind, e in events if kind == "gate_resolved")
    assert set(resolved.values()) == {1}
    emails = sent(outbox)
    assert sorted(k.split(":", 1)[1] for k in emails) == ["t1:s1c0", "t6:s1c0"]
    for key, went in sent_at_kill.items():
        assert emails[key] == went, (key, emails)  # never again
