"""Random sequences of requests to two daemons serving one PostgreSQL
journal, each request sent to either, keep the promises of the README's API
table and of its PostgreSQL journal section, whatever came before: a daemon
stopped and started again, or killed and its runs taken over, included."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from daemon_process import DaemonProcess, check_runs_page, read_events, wait_for
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replan._demo import GOAL
from replan.supervisor import fold_journal

NO_GATE: dict[str, Any] = {"gate_on": []}
LIVE = ("running", "waiting_for_human")
LEASE_S = 2
"""Short leases and frequent looks: a takeover takes a few seconds."""
TAKEOVER_S = 20
"""How long a run may wait for a daemon to take it over (a lease, a look,
and a loaded machine's slack)."""
_examples = itertools.count()


def _env(dsn: str) -> dict[str, str]:
    return {
        "REPLAN_JOURNAL_DSN": dsn,
        "REPLAN_JOURNAL_LEASE_S": str(LEASE_S),
        "REPLAN_REDRIVE_INTERVAL_S": "0.3",
        "REPLAN_HEARTBEAT_S": "0.5",
        "REPLAN_DRAIN_GRACE_S": "0",
    }


def _both(*calls: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """The calls sent at once, each from a thread of its own."""
    start = threading.Barrier(len(calls))

    def send(call: Callable[[], httpx.Response]) -> httpx.Response:
        start.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(send, calls))


class TwoDaemons(RuleBasedStateMachine):
    """Two daemons on one journal, kept across examples (each example's runs
    and keys are its own); what the machine knows is only what its own
    requests were answered."""

    daemons: ClassVar[list[DaemonProcess]]
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.example = next(_examples)
        for daemon in self.daemons:
            if daemon.proc is None or daemon.proc.poll() is not None:
                daemon.start()
        self.clients = [d.client() for d in self.daemons]
        self.down: set[int] = set()
        self.stopped = False
        """A daemon was stopped or killed (at most once an example: each
        costs seconds)."""
        self.keyed: dict[str, tuple[str, dict[str, Any]]] = {}
        self.gated: dict[str, bool] = {}
        self.ended: dict[str, dict[str, Any]] = {}
        self.answered: dict[str, tuple[str, str] | None] = {}
        """Each gate's first answer that was taken (200 or 202): decision, by
        (None: one of two sent at once, not known which)."""
        self.pending: set[str] = set()
        """Runs with an answer or a cancel forwarded, not yet applied."""
        self.cancelled: set[str] = set()
        """Runs whose cancel was taken (200 or 202)."""
        self.bys = (f"by{n}" for n in itertools.count())

    def teardown(self) -> None:
        try:
            for i in sorted(self.down):
                self.daemons[i].start()
            self.down.clear()
            # What was forwarded is applied, wherever the run went.
            for run_id in sorted(self.pending):
                self.settled(run_id)
            # The next example starts with no run of this one waiting.
            for run_id in self.gated:
                if run_id not in self.ended:
                    self.call(0, "POST", f"/v1/runs/{run_id}/cancel")
        finally:
            for client in self.clients:
                client.close()

    # -- requests -----------------------------------------------------------

    def up(self, i: int) -> int:
        """Daemon ``i``, or the other one while ``i`` is down."""
        return 1 - i if i in self.down else i

    def holder_pid(self, holder: str | None) -> int | None:
        return None if holder is None else int(holder.rpartition(":")[2])

    def call(self, i: int, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.clients[self.up(i)].request(method, url, **kwargs)
        assert response.status_code < 500, (i, method, url, response.text)
        if response.status_code >= 400:
            problem = response.json()
            assert set(problem) == {"detail", "field"}, response.text
            assert problem["detail"], response.text
        return response

    def view(self, i: int, run_id: str) -> dict[str, Any]:
        response = self.call(i, "GET", f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        if view["status"] not in LIVE and run_id not in self.ended:
            # Both daemons read an ended run alike, from then on.
            self.ended[run_id] = view
            assert self.view(1 - i, run_id) == view
        return view

    def answered_by(self, run_id: str, gate_id: str, by: str) -> None:
        """Both daemons show the gate answered by ``by``."""
        for view in self.views(run_id):
            (info,) = [g for g in view["gates"] if g["request"]["gate_id"] == gate_id]
            assert info["resolution"]["by"] == by

    def views(self, run_id: str) -> list[dict[str, Any]]:
        return [self.view(i, run_id) for i in (0, 1)]

    def newest(self, i: int) -> str | None:
        page = self.call(i, "GET", "/v1/runs", params={"limit": 1}).json()
        return page["runs"][0]["run_id"] if page["runs"] else None

    def settled(self, run_id: str) -> None:
        """Wait for what was forwarded for the run to be applied: its gates
        answered as first answered, or the run cancelled."""

        def done() -> bool:
            view = self.view(0, run_id)
            if view["status"] == "cancelled":
                return True
            for gate in view["gates"]:
                answered = gate["request"]["gate_id"] in self.answered
                if answered and gate["resolution"] is None:
                    return False
            return run_id not in self.cancelled or view["status"] not in LIVE

        wait_for(done, TAKEOVER_S, what=f"what was forwarded for run {run_id} applied")
        view = self.view(0, run_id)
        for gate in view["gates"]:
            first = self.answered.get(gate["request"]["gate_id"])
            resolution = gate["resolution"]
            if first is not None and resolution["by"] != "supervisor":
                assert (resolution["decision"], resolution["by"]) == first, gate
        self.pending.discard(run_id)

    # -- submitting ---------------------------------------------------------

    def body(self, gated: bool, goal: str) -> dict[str, Any]:
        body: dict[str, Any] = {"goal": goal}
        if not gated:
            body["gate_policy"] = NO_GATE
        return body

    @rule(
        target=runs,
        i=st.integers(0, 1),
        gated=st.booleans(),
        key=st.none() | st.sampled_from(["key-a", "key-b"]),
        goal=st.sampled_from([GOAL, "Where does sparse attention stand?"]),
    )
    def submit(self, i: int, gated: bool, key: str | None, goal: str) -> Any:
        body = self.body(gated, goal)
        headers = {}
        if key is not None:
            headers["Idempotency-Key"] = f"{key}-{self.example}"
        before = self.newest(i)
        response = self.call(i, "POST", "/v1/runs", json=body, headers=headers)
        if key is not None and key in self.keyed:
            self.resent(response, key, body)
            assert self.newest(1 - i) == before
            return multiple()
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]
        assert run_id not in self.gated
        assert response.headers["location"] == f"/v1/runs/{run_id}"
        assert self.newest(1 - i) == run_id
        self.gated[run_id] = gated
        if key is not None:
            self.keyed[key] = (run_id, body)
        return run_id

    def resent(self, response: httpx.Response, key: str, body: dict[str, Any]) -> None:
        run_id, first = self.keyed[key]
        if first != body:
            assert response.status_code == 422, response.text
            assert response.json()["field"] == "idempotency-key"
            assert run_id in response.json()["detail"]
            return
        assert response.status_code == 200, response.text
        assert response.json()["run_id"] == run_id
        if run_id in self.ended:
            assert response.json()["status"] == self.ended[run_id]["status"]
        assert response.json()["url"] == f"/v1/runs/{run_id}"
        assert response.headers["location"] == f"/v1/runs/{run_id}"

    @precondition(lambda self: not self.down)
    @rule(
        target=runs,
        gated=st.booleans(),
        key=st.sampled_from(["key-c", "key-d"]),
        goal=st.sampled_from([GOAL, "Where does sparse attention stand?"]),
    )
    def submit_at_both_at_once(self, gated: bool, key: str, goal: str) -> Any:
        body = self.body(gated, goal)
        headers = {"Idempotency-Key": f"{key}-{self.example}"}
        before = self.newest(0)
        answers = _both(
            *(
                lambda i=i: self.call(i, "POST", "/v1/runs", json=body, headers=headers)
                for i in (0, 1)
            )
        )
        if key in self.keyed:
            for response in answers:
                self.resent(response, key, body)
            assert self.newest(0) == before
            return multiple()
        # One started the run, the other got it.
        assert sorted(r.status_code for r in answers) == [200, 202], [
            r.text for r in answers
        ]
        (run_id,) = {r.json()["run_id"] for r in answers}
        assert self.newest(1) == run_id
        self.gated[run_id] = gated
        self.keyed[key] = (run_id, body)
        return run_id

    @initialize(target=runs, i=st.integers(0, 1), gated=st.booleans())
    def start_a_run(self, i: int, gated: bool) -> Any:
        return self.submit(i, gated, None, GOAL)

    @rule(i=st.integers(0, 1), run_id=runs)
    def wait_for_a_gate(self, i: int, run_id: str) -> None:
        """Let the run move on until it waits for a person or ends."""
        wait_for(
            lambda: self.view(i, run_id)["status"] != "running",
            TAKEOVER_S,
            what=f"run {run_id} waiting or ended",
        )

    # -- gates --------------------------------------------------------------

    def expected_answers(self, i: int, run_id: str) -> set[int]:
        """What an answer to the run's gate may get, seen from before it."""
        gate_id = f"{run_id}-g1"
        if gate_id in self.answered:
            return {409}
        view = self.view(i, run_id)
        gates = {g["request"]["gate_id"]: g for g in view["gates"]}
        if gate_id in gates:
            if gates[gate_id]["resolution"] is not None or view["status"] not in LIVE:
                return {409}
            if run_id in self.pending:
                # A cancel forwarded may be applied first.
                return {200, 202, 409}
            return {200, 202}
        if view["status"] not in LIVE:
            return {404}
        # Not open yet: it may open meanwhile, unless the run asks for none.
        return {200, 202, 404} if self.gated[run_id] else {404}

    def answered_so(
        self,
        i: int,
        run_id: str,
        response: httpx.Response,
        decision: str,
        by: str,
        allowed: set[int],
    ) -> None:
        """Check an answer's response, and learn from it."""
        gate_id = f"{run_id}-g1"
        assert response.status_code in allowed, (allowed, response.text)
        body = response.json()
        if response.status_code in (200, 202):
            assert (body["gate_id"], body["run_id"], body["decision"]) == (
                gate_id,
                run_id,
                decision,
            )
            first = self.answered.setdefault(gate_id, (decision, by))
            assert first == (decision, by), (first, response.text)
        if response.status_code == 200:
            assert set(body) == {"gate_id", "run_id", "decision"}, body
            # Journaled: both daemons read it.
            for view in self.views(run_id):
                (info,) = [
                    g for g in view["gates"] if g["request"]["gate_id"] == gate_id
                ]
                assert info["resolution"]["decision"] == decision
                assert info["resolution"]["by"] == by
        elif response.status_code == 202:
            if body["state"] == "applied":
                what = f"gate {gate_id}: {decision} by {by} was applied by"
                if body["driven_by"] is None:
                    # A run nobody drove as it was sent, taken over and
                    # driven to its end before its sender could name who.
                    assert body["detail"] == (
                        f"{what} the daemon that took run {run_id} over"
                    ), body
                else:
                    assert body["detail"] == (
                        f"{what} daemon {body['driven_by']}, which drives run {run_id}"
                    ), body
                self.answered_by(run_id, gate_id, by)
            else:
                self.pending.add(run_id)
        elif response.status_code == 404:
            assert body["field"] == "gate_id"
        else:
            assert body["field"] is None
            first = self.answered.get(gate_id)
            if first is not None and run_id not in self.pending:
                assert body["detail"] == (
                    f"gate {gate_id} is already resolved ({first[0]} by {first[1]})"
                ), body
            elif gate_id in self.answered and run_id not in self.pending:
                assert body["detail"].startswith(
                    f"gate {gate_id} is already resolved ("
                ), body
            elif (
                gate_id not in self.answered
                and self.ended.get(run_id, {}).get("status") == "cancelled"
            ):
                assert body["detail"] == (
                    f"gate {gate_id} is closed: its run ended cancelled"
                ), body

    @rule(
        i=st.integers(0, 1),
        run_id=runs,
        decision=st.sampled_from(["approve", "reject"]),
        waited=st.booleans(),
    )
    def answer_the_gate(self, i: int, run_id: str, decision: str, waited: bool) -> None:
        if waited:
            self.wait_for_a_gate(1 - i, run_id)
        allowed = self.expected_answers(i, run_id)
        by = next(self.bys)
        response = self.call(
            i, "POST", f"/v1/gates/{run_id}-g1", json={"decision": decision, "by": by}
        )
        self.answered_so(i, run_id, response, decision, by, allowed)

    @precondition(lambda self: not self.down)
    @rule(run_id=runs, waited=st.booleans(), same=st.booleans())
    def answer_at_both_at_once(self, run_id: str, waited: bool, same: bool) -> None:
        """Two answers at once, one at each daemon: two people's, or one
        person's sent twice (a client's retry at another daemon)."""
        if waited:
            self.wait_for_a_gate(0, run_id)
        allowed = self.expected_answers(0, run_id) | self.expected_answers(1, run_id)
        if allowed & {200, 202}:
            allowed.add(409)  # the other's
        by = next(self.bys)
        sent = [("approve", by), ("approve" if same else "reject", by)]
        if not same:
            sent[1] = ("reject", next(self.bys))
        answers = _both(
            *(
                lambda i=i, d=d, b=b: self.call(
                    i, "POST", f"/v1/gates/{run_id}-g1", json={"decision": d, "by": b}
                )
                for i, (d, b) in enumerate(sent)
            )
        )
        taken = [(i, r) for i, r in enumerate(answers) if r.status_code in (200, 202)]
        if len(taken) < 2:
            # The one taken first, then the other.
            for i, response in sorted(
                enumerate(answers), key=lambda p: p[1].status_code >= 400
            ):
                decision, by = sent[i]
                self.answered_so(i, run_id, response, decision, by, allowed)
            return
        gate_id = f"{run_id}-g1"
        if same:
            # The same answer twice is one answer: each was told so.
            self.answered[gate_id] = sent[0]
            if all(
                r.status_code == 200 or r.json()["state"] == "applied" for _, r in taken
            ):
                self.answered_by(run_id, gate_id, by)
            else:
                self.pending.add(run_id)
            return
        # Both taken: the journal keeps one; the other could only have been
        # left waiting there for the run's driver, which refuses it.
        applied = [
            sent[i]
            for i, r in taken
            if r.status_code == 200 or r.json()["state"] == "applied"
        ]
        assert len(applied) < 2, [r.text for r in answers]
        self.answered[gate_id] = applied[0] if applied else None
        self.pending.add(run_id)

    # -- cancelling ---------------------------------------------------------

    @rule(i=st.integers(0, 1), run_id=runs)
    def cancel(self, i: int, run_id: str) -> None:
        before = self.view(i, run_id)
        response = self.call(i, "POST", f"/v1/runs/{run_id}/cancel")
        body = response.json()
        if before["status"] not in LIVE:
            assert response.status_code == 409, response.text
            assert body["detail"] == f"run {run_id} already ended {before['status']}"
            return
        # It may have ended on its own meanwhile.
        assert response.status_code in (200, 202, 409), response.text
        if response.status_code == 409:
            after = self.view(i, run_id)
            assert after["status"] not in ("cancelled", *LIVE), response.text
            assert body["detail"] == f"run {run_id} already ended {after['status']}"
            return
        self.cancelled.add(run_id)
        if response.status_code == 200:
            assert set(body) == {"run_id", "status", "stop_reason"}, body
            assert body["status"] == "cancelled"
        elif body["state"] == "applied":
            # Applied by the daemon that drives the run, or, for a run
            # nobody drove as it was sent, by the one (maybe this one) that
            # took it over meanwhile.
            assert body["status"] == "cancelled", body
        else:
            assert body["status"] in LIVE, body
            self.pending.add(run_id)
            return
        for after in self.views(run_id):
            assert after["status"] == "cancelled"
            assert all(g["resolution"] is not None for g in after["gates"])

    @precondition(lambda self: not self.down)
    @rule(run_id=runs)
    def cancel_at_both_at_once(self, run_id: str) -> None:
        before = self.view(0, run_id)
        answers = _both(
            *(
                lambda i=i: self.call(i, "POST", f"/v1/runs/{run_id}/cancel")
                for i in (0, 1)
            )
        )
        if before["status"] not in LIVE:
            for response in answers:
                assert response.status_code == 409, response.text
            return
        for response in answers:
            assert response.status_code in (200, 202, 409), response.text
        taken = [r for r in answers if r.status_code != 409]
        if not taken:
            # It ended on its own first.
            after = self.view(0, run_id)
            assert after["status"] not in ("cancelled", *LIVE), after["status"]
            return
        self.cancelled.add(run_id)
        if any(
            r.status_code == 202 and r.json()["state"] == "forwarded" for r in taken
        ):
            self.pending.add(run_id)
            return
        for response in answers:
            detail = response.json().get("detail", "")
            if response.status_code == 409:
                assert detail == f"run {run_id} already ended cancelled", detail
            else:
                assert response.json()["status"] == "cancelled", response.text
        for after in self.views(run_id):
            assert after["status"] == "cancelled"

    # -- reading ------------------------------------------------------------

    @rule(i=st.integers(0, 1), run_id=runs)
    def read_the_run(self, i: int, run_id: str) -> None:
        self.view(i, run_id)

    @rule(
        i=st.integers(0, 1),
        statuses=st.lists(
            st.sampled_from(
                ["running", "waiting_for_human", "completed", "cancelled", "failed"]
            ),
            max_size=2,
        ),
        limit=st.sampled_from([1, 2, 50, 1000]),
    )
    def list_runs(self, i: int, statuses: list[str], limit: int) -> None:
        params: list[tuple[str, str | int]] = [("status", s) for s in statuses]
        params.append(("limit", limit))
        response = self.call(i, "GET", "/v1/runs", params=params)
        check_runs_page(response, statuses, limit, self.ended)

    @rule(i=st.integers(0, 1), run_id=st.none() | runs)
    def list_gates(self, i: int, run_id: str | None) -> None:
        params = {"limit": 1000}
        if run_id is not None:
            params["run_id"] = run_id
        response = self.call(i, "GET", "/v1/gates", params=params)
        assert response.status_code == 200, response.text
        listing = response.json()
        listed = {g["gate_id"] for g in listing["gates"]}
        assert set(listing["elsewhere"]) <= listed, listing
        own = self.daemons[self.up(i)].pid
        for gate_id, holder in listing["elsewhere"].items():
            assert self.holder_pid(holder) != own, (gate_id, holder)
        for gate in listing["gates"]:
            if run_id is not None:
                assert gate["run_id"] == run_id
            if gate["run_id"] not in self.gated:
                continue  # another example's
            if gate["run_id"] in self.pending:
                # An answer or a cancel forwarded may be applied meanwhile.
                continue
            assert gate["gate_id"] not in self.answered, gate
            for view in self.views(gate["run_id"]):
                assert view["status"] == "waiting_for_human", view["status"]
                (info,) = [
                    g
                    for g in view["gates"]
                    if g["request"]["gate_id"] == gate["gate_id"]
                ]
                assert info["resolution"] is None

    @rule(i=st.integers(0, 1), run_id=runs, after=st.integers(0, 40))
    def read_events(self, i: int, run_id: str, after: int) -> None:
        view = self.view(i, run_id)
        whole = self.events(i, run_id, 0, view["last_seq"])
        seqs = [seq for seq, _ in whole]
        assert seqs == list(range(1, view["last_seq"] + 1)), seqs
        events = [event for _, event in whole]
        state = fold_journal(run_id, events)
        assert state.status.value == view["status"]
        assert state.seq == view["last_seq"]
        assert [g.model_dump(mode="json") for g in state.gates.values()] == view[
            "gates"
        ]
        assert state.result().model_dump(mode="json") == view["result"]
        resolved = [e.gate_id for e in events if e.kind == "gate_resolved"]
        assert len(resolved) == len(set(resolved)), resolved
        tail = self.events(1 - i, run_id, after, view["last_seq"])
        assert [seq for seq, _ in tail] == [seq for seq in seqs if seq > after]
        assert [e for _, e in tail] == [e for seq, e in whole if seq > after]

    def events(
        self, i: int, run_id: str, after: int, last: int
    ) -> list[tuple[int, Any]]:
        return read_events(self.clients[self.up(i)], run_id, after, last)

    # -- stopping -----------------------------------------------------------

    @precondition(lambda self: not self.down and not self.stopped)
    @rule(i=st.integers(0, 1))
    def restart(self, i: int) -> None:
        """SIGTERM drains the daemon; it lets go of its runs as it exits,
        and the other daemon takes them over at its next look."""
        self.stopped = True
        assert self.daemons[i].terminate() == 0, self.daemons[i].output()
        self.daemons[i].start()

    @precondition(lambda self: not self.down and not self.stopped)
    @rule(i=st.integers(0, 1), hard=st.booleans())
    def stop(self, i: int, hard: bool) -> None:
        """kill -9 (the other daemon takes its runs over once their leases
        expire) or SIGTERM (at its next look); the daemon starts again at
        the example's end."""
        self.stopped = True
        if hard:
            self.daemons[i].kill()
        else:
            assert self.daemons[i].terminate() == 0, self.daemons[i].output()
        self.down.add(i)

    # -- invariants ---------------------------------------------------------

    @invariant()
    def a_finished_run_never_changes(self) -> None:
        for run_id, view in list(self.ended.items()):
            for i in (0, 1):
                response = self.call(i, "GET", f"/v1/runs/{run_id}")
                assert response.json() == view, (i, run_id)


@pytest.fixture
def two_daemons(tmp_path: Path, postgres_dsn: str) -> Iterator[list[DaemonProcess]]:
    started = [
        DaemonProcess(
            tmp_path / name, "--model", "scripted:demo", env=_env(postgres_dsn)
        )
        for name in ("first", "second")
    ]
    try:
        for daemon in started:
            daemon.start()
        yield started
    finally:
        for daemon in started:
            daemon.close()


@pytest.mark.timeout(180)  # real processes on a loaded machine: room to spare
def test_random_sequences_of_requests_to_two_daemons_keep_the_api_promises(
    two_daemons: list[DaemonProcess],
) -> None:
    machine = type("Bound", (TwoDaemons,), {"daemons": two_daemons})
    # About 25 s; search further with --hypothesis-profile=explore.
    run = settings(
        max_examples=20,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    run_state_machine_as_test(machine, settings=run)
