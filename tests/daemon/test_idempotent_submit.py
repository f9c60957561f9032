"""Submissions sent again with their ``Idempotency-Key``: one run per key,
also when the two arrive at once or a restart comes between them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import pytest
from daemon_process import DaemonProcess
from in_process import serving

from replan import RunSpec
from replan._demo import GOAL, demo_model
from replan._errors import UnknownRunError
from replan.daemon import DaemonSettings, Token
from replan.daemon._idempotency import run_id_of
from replan.daemon._service import Daemon
from replan.messages import RunSubmitted
from replan.store import SQLiteStore
from replan.supervisor import RunState, apply
from replan.supervisor._run import summary_of

TOKEN = "idempotency-test-token"
NO_GATE = {"gate_on": []}


def _daemon(tmp_path: Path, **settings: object) -> Daemon:
    return Daemon(
        settings=DaemonSettings(data_dir=tmp_path, **settings),  # type: ignore[arg-type]
        token=Token(TOKEN),
        model=demo_model(),
    )


async def test_the_same_key_sent_again_gets_the_run_it_started(
    tmp_path: Path,
) -> None:
    spec = {"goal": GOAL, "gate_policy": NO_GATE, "limits": {"max_replans": 2}}
    async with serving(_daemon(tmp_path)) as client:
        key = {"Idempotency-Key": "order-7 retry"}
        first = await client.post("/v1/runs", json=spec, headers=key)
        again = await client.post("/v1/runs", json=spec, headers=key)
        other = await client.post(
            "/v1/runs", json=spec, headers={"Idempotency-Key": "order-8"}
        )
        unkeyed = await client.post("/v1/runs", json=spec)
        runs = (await client.get("/v1/runs")).json()["runs"]

    assert first.status_code == 202, first.text
    assert again.status_code == 200, again.text
    run_id = first.json()["run_id"]
    assert again.json()["run_id"] == run_id
    assert again.headers["location"] == f"/v1/runs/{run_id}"
    assert other.status_code == unkeyed.status_code == 202
    assert len({run_id, other.json()["run_id"], unkeyed.json()["run_id"]}) == 3
    assert sorted(r["run_id"] for r in runs) == sorted(
        [run_id, other.json()["run_id"], unkeyed.json()["run_id"]]
    )


async def test_keyed_submissions_sent_at_once_start_one_run(tmp_path: Path) -> None:
    async with serving(_daemon(tmp_path)) as client:
        answers: list[tuple[int, str]] = []

        async def submit() -> None:
            response = await client.post(
                "/v1/runs", json={"goal": GOAL}, headers={"Idempotency-Key": "k1"}
            )
            answers.append((response.status_code, response.json()["run_id"]))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(submit)
        runs = (await client.get("/v1/runs")).json()["runs"]
        await client.post(f"/v1/runs/{runs[0]['run_id']}/cancel")

    assert sorted(code for code, _ in answers) == [200, 200, 200, 200, 202]
    assert {run_id for _, run_id in answers} == {runs[0]["run_id"]}
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("second", "differs"),
    [
        ({"goal": "another goal", "metadata": {"ticket": 7}}, "goal"),
        (
            {"goal": GOAL, "metadata": {"ticket": 7}, "limits": {"max_replans": 1}},
            "limits.max_replans",
        ),
        ({"goal": GOAL, "metadata": {"ticket": 8}}, "metadata"),
    ],
    ids=["goal", "limits", "metadata"],
)
async def test_the_same_key_with_another_spec_is_refused_naming_the_key(
    tmp_path: Path, second: dict[str, object], differs: str
) -> None:
    key = {"Idempotency-Key": "k2"}
    async with serving(_daemon(tmp_path)) as client:
        first = await client.post(
            "/v1/runs",
            json={"goal": GOAL, "metadata": {"ticket": 7}, "gate_policy": NO_GATE},
            headers=key,
        )
        refused = await client.post(
            "/v1/runs", json={**second, "gate_policy": NO_GATE}, headers=key
        )
        runs = (await client.get("/v1/runs")).json()["runs"]

    assert first.status_code == 202
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "idempotency-key"
    assert refused.json()["detail"] == (
        f"Idempotency-Key: the key started run {first.json()['run_id']} with "
        f"another spec (it differs in {differs}): a new run needs a new key"
    )
    assert len(runs) == 1


@pytest.mark.parametrize("key", ["", " ", "x" * 256, "caf\u00e9"])
async def test_a_key_no_header_can_be_is_a_400_naming_it(
    tmp_path: Path, key: str
) -> None:
    async with serving(_daemon(tmp_path)) as client:
        response = await client.post(
            "/v1/runs",
            json={"goal": GOAL},
            headers={"Idempotency-Key": key.encode()},  # type: ignore[dict-item]
        )
        runs = (await client.get("/v1/runs")).json()["runs"]
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "idempotency-key"
    assert runs == []


async def test_a_key_sent_again_past_max_active_runs_gets_its_run(
    tmp_path: Path,
) -> None:
    # The run it started holds the one place: sent again, it is no new run.
    async with serving(_daemon(tmp_path, max_active_runs=1)) as client:
        key = {"Idempotency-Key": "k3"}
        first = await client.post("/v1/runs", json={"goal": GOAL}, headers=key)
        again = await client.post("/v1/runs", json={"goal": GOAL}, headers=key)
        refused = await client.post("/v1/runs", json={"goal": GOAL})
        await client.post(f"{first.json()['url']}/cancel")
    assert (first.status_code, again.status_code, refused.status_code) == (
        202,
        200,
        429,
    )


def test_a_key_sent_again_after_a_restart_gets_the_run_it_started(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    spec = {"goal": GOAL, "limits": {"max_replans": 2}}
    key = {"Idempotency-Key": "restart-key"}
    process = DaemonProcess(data).start()
    try:
        with process.client() as client:
            first = client.post("/v1/runs", json=spec, headers=key)
            assert first.status_code == 202, first.text
        process.kill()
        # Restarted with other default limits: the spec sent is still the same.
        process = DaemonProcess(
            data, env={"REPLAN_DEFAULT_LIMITS__MAX_REPLANS": "1"}
        ).start()
        with process.client() as client:
            again = client.post("/v1/runs", json=spec, headers=key)
            other = client.post("/v1/runs", json={"goal": "other"}, headers=key)
            runs = client.get("/v1/runs").json()["runs"]
            client.post(f"{first.json()['url']}/cancel")
    finally:
        process.close()
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == first.json()["run_id"]
    assert other.status_code == 422
    assert [r["run_id"] for r in runs] == [first.json()["run_id"]]


async def test_a_keyed_run_another_daemon_journals_first_is_the_one_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two daemons on one shared journal take the same key at once: both
    # find no run, and the journal refuses the second one's first write.
    daemon = _daemon(tmp_path)
    run_id = run_id_of("k4")
    async with serving(daemon) as client:
        async with SQLiteStore(tmp_path / "journal.db") as other:
            event = RunSubmitted(
                seq=1, at=datetime.now(UTC), run_id=run_id, spec=RunSpec(goal=GOAL)
            )
            await other.append(run_id, [event], summary_of(apply(None, event)))
        looked = daemon.run_state

        async def not_yet(wanted: str) -> RunState:
            monkeypatch.setattr(daemon, "run_state", looked)
            raise UnknownRunError(wanted)

        monkeypatch.setattr(daemon, "run_state", not_yet)
        answer = await client.post(
            "/v1/runs", json={"goal": GOAL}, headers={"Idempotency-Key": "k4"}
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["run_id"] == run_id


@pytest.mark.parametrize(("retention", "again"), [("compact", 200), ("delete", 202)])
async def test_a_key_is_remembered_as_long_as_retention_keeps_its_run(
    tmp_path: Path, retention: str, again: int
) -> None:
    daemon = _daemon(
        tmp_path,
        retention=retention,
        retention_age_s=0,
        retention_interval_s=0.1,
    )
    spec = {"goal": GOAL, "gate_policy": NO_GATE}
    key = {"Idempotency-Key": "k5"}
    async with serving(daemon) as client:
        first = await client.post("/v1/runs", json=spec, headers=key)
        run_id = first.json()["run_id"]
        with anyio.fail_after(20):
            while True:
                counters = daemon.counters
                if counters.compacted + counters.deleted:
                    break
                await anyio.sleep(0.05)
        second = await client.post("/v1/runs", json=spec, headers=key)
    assert first.status_code == 202
    assert second.status_code == again, second.text
    assert second.json()["run_id"] == run_id


async def test_daemons_on_one_postgresql_journal_start_one_run_per_key(
    tmp_path: Path, postgres_dsn: str
) -> None:
    def daemon(name: str) -> Daemon:
        return _daemon(tmp_path / name, journal_dsn=postgres_dsn)

    first, second = daemon("a"), daemon("b")
    answers: list[tuple[int, str]] = []
    async with serving(first) as one, serving(second) as two:

        async def submit(client: httpx.AsyncClient) -> None:
            response = await client.post(
                "/v1/runs", json={"goal": GOAL}, headers={"Idempotency-Key": "k6"}
            )
            answers.append((response.status_code, response.json()["run_id"]))

        async with anyio.create_task_group() as tg:
            for client in (one, two, one, two):
                tg.start_soon(submit, client)
        runs = (await one.get("/v1/runs")).json()["runs"]
        await one.post(f"/v1/runs/{runs[0]['run_id']}/cancel")
    assert sorted(code for code, _ in answers) == [200, 200, 200, 202], answers
    assert {run_id for _, run_id in answers} == {run_id_of("k6")}
    assert len(runs) == 1
