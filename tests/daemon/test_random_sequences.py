"""Random sequences of requests to a daemon served over HTTP on 127.0.0.1
keep the promises of the README's API table, whatever came before."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest
from anyio.from_thread import BlockingPortal
from daemon_process import TOKEN, check_runs_page, read_events
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from in_process import listening

from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.supervisor import fold_journal


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio only


NO_GATE: dict[str, Any] = {"gate_on": []}
LIVE = ("running", "waiting_for_human")
_dirs = itertools.count()

# A bad submission (its body and Idempotency-Key), and the status and
# field its answer names.
VALID = b'{"goal": "x"}'
BAD_SUBMISSIONS: list[tuple[bytes, str | None, int, str]] = [
    (b"not json", None, 400, "body"),
    (b"[]", None, 422, "body"),
    (b"{}", None, 422, "goal"),
    (b'{"goal": ""}', None, 422, "goal"),
    (b'{"goal": "x", "limits": {"max_replans": -1}}', None, 422, "limits.max_replans"),
    (b'{"goal": "x", "metadata": {"a": [{"b": 1e400}]}}', None, 422, "metadata.a.0.b"),
    (
        b'{"goal": "x", "gate_policy": {"gate_on": ["nope"]}}',
        None,
        422,
        "gate_policy.gate_on.0",
    ),
    (VALID, "", 400, "idempotency-key"),
    (VALID, "k" * 256, 400, "idempotency-key"),
    (VALID, "a\tb", 400, "idempotency-key"),
]
# A bad answer to a gate, and the field its 422 (or 400) names.
BAD_ANSWERS: list[tuple[bytes, int, str]] = [
    (b"{", 400, "body"),
    (b'{"decision": "maybe", "by": "ana"}', 422, "decision"),
    (b'{"decision": "edit", "by": "ana"}', 422, "tasks"),
    (
        b'{"decision": "approve", "by": "ana", "tasks": '
        b'[{"key": "a", "description": "x"}]}',
        422,
        "tasks",
    ),
]


class Sequences(RuleBasedStateMachine):
    """One fresh daemon per example; what the machine knows of it is only
    what its own requests were answered."""

    portal: ClassVar[BlockingPortal]
    root: ClassVar[Path]
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        data = self.root / f"data-{next(_dirs)}"
        daemon = Daemon(
            settings=DaemonSettings(
                data_dir=data, api_token=TOKEN, log_level="warning", drain_grace_s=0
            ),
            token=Token(TOKEN),
            model=demo_model(),
        )
        self.served = self.portal.wrap_async_context_manager(listening(daemon))
        url = self.served.__enter__()
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        self.keyed: dict[str, tuple[str, dict[str, Any]]] = {}
        self.gated: dict[str, bool] = {}
        self.ended: dict[str, dict[str, Any]] = {}
        self.answered: set[str] = set()

    def teardown(self) -> None:
        self.client.close()
        self.served.__exit__(None, None, None)

    # -- requests -----------------------------------------------------------

    def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.client.request(method, url, **kwargs)
        assert response.status_code < 500, (method, url, response.text)
        if response.status_code >= 400:
            problem = response.json()
            assert set(problem) == {"detail", "field"}, response.text
            assert problem["detail"], response.text
        return response

    def view(self, run_id: str) -> dict[str, Any]:
        response = self.call("GET", f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        if view["status"] not in LIVE:
            self.ended.setdefault(run_id, view)
        return view

    def run_count(self) -> int:
        page = self.call("GET", "/v1/runs", params={"limit": 1000}).json()
        return len(page["runs"])

    def expect_problem(
        self, response: httpx.Response, status: int, field: str | None
    ) -> None:
        assert response.status_code == status, response.text
        assert response.json()["field"] == field, response.text

    # -- submitting ---------------------------------------------------------

    @rule(
        target=runs,
        gated=st.booleans(),
        key=st.none() | st.sampled_from(["key-a", "key-b"]),
        goal=st.sampled_from([GOAL, "Where does sparse attention stand?"]),
    )
    def submit(self, gated: bool, key: str | None, goal: str) -> Any:
        body: dict[str, Any] = {"goal": goal}
        if not gated:
            body["gate_policy"] = NO_GATE
        headers = {"Idempotency-Key": key} if key is not None else {}
        before = self.run_count()
        response = self.call("POST", "/v1/runs", json=body, headers=headers)
        if key is not None and key in self.keyed:
            run_id, first = self.keyed[key]
            if first != body:
                self.expect_problem(response, 422, "idempotency-key")
                assert run_id in response.json()["detail"]
            else:
                assert response.status_code == 200, response.text
                assert response.json()["run_id"] == run_id
                if run_id in self.ended:
                    assert response.json()["status"] == self.ended[run_id]["status"]
                assert response.json()["url"] == f"/v1/runs/{run_id}"
                assert response.headers["location"] == f"/v1/runs/{run_id}"
            assert self.run_count() == before
            return multiple()
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]
        assert run_id not in self.gated
        assert response.headers["location"] == f"/v1/runs/{run_id}"
        assert self.run_count() == before + 1
        self.gated[run_id] = gated
        if key is not None:
            self.keyed[key] = (run_id, body)
        return run_id

    @initialize(target=runs, gated=st.booleans())
    def start_a_run(self, gated: bool) -> Any:
        return self.submit(gated, None, GOAL)

    @rule(bad=st.sampled_from(BAD_SUBMISSIONS))
    def submit_something_bad(self, bad: tuple[bytes, str | None, int, str]) -> None:
        content, key, status, field = bad
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        before = self.run_count()
        response = self.call("POST", "/v1/runs", content=content, headers=headers)
        self.expect_problem(response, status, field)
        assert self.run_count() == before

    @rule(run_id=runs)
    def wait_for_a_gate(self, run_id: str) -> None:
        """Let the run move on until it waits for a person or ends."""
        for _ in range(400):
            if self.view(run_id)["status"] != "running":
                return
            time.sleep(0.025)
        raise AssertionError(f"run {run_id} neither waits nor ends after 10 s")

    # -- gates --------------------------------------------------------------

    def expected_answers(self, run_id: str) -> set[int]:
        """What an answer to the run's gate may get, seen from before it."""
        view = self.view(run_id)
        gate_id = f"{run_id}-g1"
        gates = {g["request"]["gate_id"]: g for g in view["gates"]}
        if gate_id in gates:
            if gates[gate_id]["resolution"] is not None or view["status"] not in LIVE:
                return {409}
            return {200}
        if view["status"] not in LIVE:
            return {404}
        # Not open yet: it may open meanwhile, unless the run asks for none.
        return {200, 404} if self.gated[run_id] else {404}

    @rule(run_id=runs, decision=st.sampled_from(["approve", "reject"]))
    def answer_the_gate(self, run_id: str, decision: str) -> None:
        gate_id = f"{run_id}-g1"
        allowed = self.expected_answers(run_id)
        if gate_id in self.answered:
            assert allowed == {409}
        response = self.call(
            "POST", f"/v1/gates/{gate_id}", json={"decision": decision, "by": "ana"}
        )
        assert response.status_code in allowed, (allowed, response.text)
        if response.status_code == 200:
            assert response.json() == {
                "gate_id": gate_id,
                "run_id": run_id,
                "decision": decision,
            }
            self.answered.add(gate_id)
            answered = self.view(run_id)
            (info,) = [
                g for g in answered["gates"] if g["request"]["gate_id"] == gate_id
            ]
            assert info["resolution"]["decision"] == decision
        elif response.status_code == 404:
            assert response.json()["field"] == "gate_id"
        else:
            assert response.json()["field"] is None
            detail = response.json()["detail"]
            if gate_id in self.answered:
                assert detail.startswith(f"gate {gate_id} is already resolved ("), (
                    detail
                )
                assert "by ana)" in detail
            elif self.ended.get(run_id, {}).get("status") == "cancelled":
                assert detail == f"gate {gate_id} is closed: its run ended cancelled"

    @rule(
        run_id=runs,
        wrong=st.sampled_from(
            [
                "gates/{run}-g7",
                "gates/{run}x-g1",
                "gates/nosuch-g1",
                "gates/{run}",
                "gates/g1",
                "runs/nosuch/cancel",
                "runs/{run}x/cancel",
            ]
        ),
    )
    def address_what_is_not_there(self, run_id: str, wrong: str) -> None:
        path = "/v1/" + wrong.format(run=run_id)
        field = "gate_id" if path.startswith("/v1/gates/") else "run_id"
        response = self.call("POST", path, json={"decision": "approve", "by": "ana"})
        self.expect_problem(response, 404, field)

    @rule(run_id=runs, bad=st.sampled_from(BAD_ANSWERS))
    def answer_with_a_bad_body(self, run_id: str, bad: tuple[bytes, int, str]) -> None:
        content, status, field = bad
        before = self.view(run_id)
        response = self.call(
            "POST",
            f"/v1/gates/{run_id}-g1",
            content=content,
            headers={"Content-Type": "application/json"},
        )
        self.expect_problem(response, status, field)
        after = self.view(run_id)
        assert [g["resolution"] for g in after["gates"][: len(before["gates"])]] == [
            g["resolution"] for g in before["gates"]
        ]

    @rule(run_id=runs, by=st.sampled_from(["", "  "]))
    def answer_with_a_blank_by(self, run_id: str, by: str) -> None:
        allowed = self.expected_answers(run_id)
        response = self.call(
            "POST", f"/v1/gates/{run_id}-g1", json={"decision": "approve", "by": by}
        )
        if allowed == {200}:
            self.expect_problem(response, 422, "by")
        else:
            assert response.status_code in allowed | {422}, response.text
        assert f"{run_id}-g1" not in [
            g["request"]["gate_id"]
            for g in self.view(run_id)["gates"]
            if g["resolution"] is not None and g["resolution"]["by"] == by
        ]

    @rule(run_id=st.none() | runs, unknown=st.booleans())
    def list_gates(self, run_id: str | None, unknown: bool) -> None:
        params = {}
        if run_id is not None:
            params["run_id"] = f"{run_id}-nope" if unknown else run_id
        response = self.call("GET", "/v1/gates", params=params)
        if run_id is not None and unknown:
            self.expect_problem(response, 404, "run_id")
            return
        assert response.status_code == 200, response.text
        for gate in response.json()["gates"]:
            if run_id is not None:
                assert gate["run_id"] == run_id
            assert gate["gate_id"] not in self.answered
            view = self.view(gate["run_id"])
            assert view["status"] == "waiting_for_human", view["status"]
            (info,) = [
                g for g in view["gates"] if g["request"]["gate_id"] == gate["gate_id"]
            ]
            assert info["resolution"] is None

    # -- cancelling ---------------------------------------------------------

    @rule(run_id=runs)
    def cancel(self, run_id: str) -> None:
        before = self.view(run_id)
        response = self.call("POST", f"/v1/runs/{run_id}/cancel")
        if before["status"] not in LIVE:
            assert response.status_code == 409, response.text
            assert response.json()["detail"] == (
                f"run {run_id} already ended {before['status']}"
            )
            return
        # It may have ended on its own meanwhile.
        assert response.status_code in (200, 409), response.text
        after = self.view(run_id)
        if response.status_code == 200:
            assert response.json()["status"] == "cancelled"
            assert after["status"] == "cancelled"
            assert all(g["resolution"] is not None for g in after["gates"])
        else:
            assert after["status"] not in ("cancelled", *LIVE)
            assert response.json()["detail"] == (
                f"run {run_id} already ended {after['status']}"
            )

    @rule(run_id=runs)
    def read_the_run(self, run_id: str) -> None:
        self.view(run_id)

    @rule(
        statuses=st.lists(
            st.sampled_from(
                ["running", "waiting_for_human", "completed", "cancelled", "failed"]
            ),
            max_size=2,
        ),
        limit=st.sampled_from([1, 2, 50, 1000, 0, 1001]),
    )
    def list_runs(self, statuses: list[str], limit: int) -> None:
        params: list[tuple[str, str | int]] = [("status", s) for s in statuses]
        params.append(("limit", limit))
        response = self.call("GET", "/v1/runs", params=params)
        if not 1 <= limit <= 1000:
            self.expect_problem(response, 422, "limit")
            return
        check_runs_page(response, statuses, limit, self.ended)

    @rule(run_id=runs, after=st.integers(0, 40))
    def read_events(self, run_id: str, after: int) -> None:
        view = self.view(run_id)
        whole = self.events(run_id, 0, view["last_seq"])
        seqs = [seq for seq, _ in whole]
        assert seqs == sorted(set(seqs)), seqs
        assert seqs[-1] == view["last_seq"]
        state = fold_journal(run_id, [event for _, event in whole])
        assert state.status.value == view["status"]
        assert state.seq == view["last_seq"]
        assert [g.model_dump(mode="json") for g in state.gates.values()] == view[
            "gates"
        ]
        assert state.result().model_dump(mode="json") == view["result"]
        tail = self.events(run_id, after, view["last_seq"])
        assert [seq for seq, _ in tail] == [seq for seq in seqs if seq > after]

    def events(self, run_id: str, after: int, last: int) -> list[tuple[int, Any]]:
        return read_events(self.client, run_id, after, last)

    @invariant()
    def a_finished_run_never_changes(self) -> None:
        for run_id, view in list(self.ended.items()):
            response = self.call("GET", f"/v1/runs/{run_id}")
            assert response.json() == view


async def test_random_sequences_of_requests_keep_the_api_promises(
    tmp_path: Path,
) -> None:
    async with BlockingPortal() as portal:
        machine = type("Bound", (Sequences,), {"portal": portal, "root": tmp_path})
        # About 25 s; search further with --hypothesis-profile=explore.
        run = settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        await anyio.to_thread.run_sync(
            lambda: run_state_machine_as_test(machine, settings=run)
        )
