"""The HTTP API of a real daemon subprocess, through httpx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from daemon_process import DaemonProcess, wait_for
from in_process import serving

from replan import ModelRequest, ScriptedModel
from replan._demo import GOAL, answer, demo_usage
from replan._demo_explore import explore_demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.supervisor import RunState

NO_GATE = {"gate_on": []}


def submit(client: httpx.Client, **spec: Any) -> str:
    body = {"goal": GOAL, **spec}
    response = client.post("/v1/runs", json=body)
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    assert response.json()["url"] == f"/v1/runs/{run_id}"
    assert response.headers["location"] == f"/v1/runs/{run_id}"
    return run_id


def finished(client: httpx.Client, run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        view: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
        return view if view["status"] not in ("running", "waiting_for_human") else None

    result: dict[str, Any] = wait_for(done)
    return result


def test_a_run_submitted_over_http_completes_and_can_be_inspected(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        run_id = submit(client, gate_policy=NO_GATE, metadata={"ticket": 7})
        view = finished(client, run_id)
        assert view["status"] == "completed"
        result = view["result"]
        assert result["output"]
        assert [t["status"] for t in result["tasks"]].count("completed") == 5
        assert view["total_usage"]["input_tokens"] > 0
        assert result["replans"][0]["outcome"] == "applied"

        versions = client.get(f"/v1/runs/{run_id}/versions").json()["versions"]
        assert [v["version"] for v in versions] == [1, 2]
        assert versions[1]["trigger"] == "scope_shift"
        assert versions[1]["removed"] == ["t2", "t3", "t4"]
        assert versions[1]["preserved"] == ["t1"]
        assert len(versions[1]["added"]) == 4

        page = client.get("/v1/runs", params={"status": "completed"}).json()
        assert [r["run_id"] for r in page["runs"]] == [run_id]
        assert client.get("/v1/runs", params={"status": "failed"}).json()["runs"] == []


def test_runs_are_listed_newest_first_in_pages(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        ids = [submit(client, gate_policy=NO_GATE) for _ in range(5)]
        first = client.get("/v1/runs", params={"limit": 2}).json()
        second = client.get("/v1/runs", params={"limit": 2, "offset": 2}).json()
        last = client.get("/v1/runs", params={"limit": 2, "offset": 4}).json()
    listed = [r["run_id"] for page in (first, second, last) for r in page["runs"]]
    assert sorted(listed) == sorted(ids)
    assert len(set(listed)) == 5
    assert (first["next_offset"], second["next_offset"], last["next_offset"]) == (
        2,
        4,
        None,
    )
    created = [r["created_at"] for page in (first, second, last) for r in page["runs"]]
    assert created == sorted(created, reverse=True)


def test_runs_are_filtered_by_each_status_given_in_pages_of_at_most_1000(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        done = submit(client, gate_policy=NO_GATE)
        waiting = submit(client)
        cancelled = submit(client)
        wait_for(lambda: len(client.get("/v1/gates").json()["gates"]) == 2)
        assert client.post(f"/v1/runs/{cancelled}/cancel").status_code == 200
        finished(client, done)
        ended = client.get(
            "/v1/runs", params=[("status", "completed"), ("status", "cancelled")]
        ).json()
        default = client.get("/v1/runs").json()
        most = client.get("/v1/runs", params={"limit": 1000})
        too_many = client.get("/v1/runs", params={"limit": 1001})
    assert sorted(r["run_id"] for r in ended["runs"]) == sorted([done, cancelled])
    assert waiting in [r["run_id"] for r in default["runs"]]
    assert default["limit"] == 50
    assert most.status_code == 200, most.text
    assert len(most.json()["runs"]) == 3
    assert too_many.status_code == 422
    assert too_many.json()["field"] == "limit"


def test_a_scope_shift_gate_is_approved_over_http(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        run_id = submit(client)
        gates = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        (gate,) = gates
        assert gate["run_id"] == run_id
        assert gate["trigger"] == "scope_shift"
        assert gate["proposal"]["removed"] == ["t2", "t3", "t4"]
        assert client.get(f"/v1/runs/{run_id}").json()["status"] == "waiting_for_human"
        # A mistyped run id is not a run with no gate waiting.
        unknown = client.get("/v1/gates", params={"run_id": "other"})
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["detail"] == "no run other"
        empty = client.get("/v1/gates", params={"run_id": ""})
        assert empty.status_code == 422, empty.text
        assert "run_id" in empty.text

        answer = client.post(
            f"/v1/gates/{gate['gate_id']}", json={"decision": "approve", "by": "erin"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "gate_id": gate["gate_id"],
            "run_id": run_id,
            "decision": "approve",
        }
        view = finished(client, run_id)
        # A run with no gate waiting (any more) has an empty list.
        none_left = client.get("/v1/gates", params={"run_id": run_id})
        again = client.post(f"/v1/gates/{gate['gate_id']}", json={"decision": "reject"})
        unknown = client.post(f"/v1/gates/{run_id}-g9", json={"decision": "reject"})
    assert view["status"] == "completed"
    assert view["result"]["versions"][1]["approved_by"] == "erin"
    assert none_left.status_code == 200, none_left.text
    assert none_left.json()["gates"] == []
    assert again.status_code == 409
    assert unknown.status_code == 404


def test_an_explore_run_is_accepted_reviewed_and_briefed_over_http(
    daemon: DaemonProcess,
) -> None:
    spec = explore_demo_spec().model_dump(mode="json", exclude_defaults=True)
    with daemon.client() as client:
        run_id = submit(client, **spec)
        # The demo's reviewers disagree sharply: a person reviews the selection.
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        assert gate["run_id"] == run_id
        assert gate["hypotheses"]
        # An edit with nothing in it is refused naming what this gate takes.
        bare = client.post(f"/v1/gates/{gate['gate_id']}", json={"decision": "edit"})
        assert bare.status_code == 422, bare.text
        assert bare.json()["field"] == "hypotheses"
        answer = client.post(
            f"/v1/gates/{gate['gate_id']}", json={"decision": "approve", "by": "ana"}
        )
        assert answer.status_code == 200, answer.text
        view = finished(client, run_id)
        # Read from the run's journal once the gate is no longer open here
        # (as for a run another daemon drives): still hypotheses.
        late = client.post(f"/v1/gates/{gate['gate_id']}", json={"decision": "edit"})
        assert late.status_code == 422, late.text
        assert late.json()["field"] == "hypotheses"
    assert view["status"] == "completed"
    brief = view["result"]["brief"]
    assert brief["status"] == "completed"
    assert brief["reviewed_by"] == "ana"
    assert 1 <= len(brief["selected"]) <= 3


def test_a_gate_can_be_answered_with_edited_tasks(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        run_id = submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        bad = client.post(
            f"/v1/gates/{gate['gate_id']}",
            json={
                "decision": "edit",
                "tasks": [{"key": "a", "description": "x", "depends_on": ["nope"]}],
            },
        )
        assert bad.status_code == 422
        assert bad.json()["field"] == "tasks"
        assert "nope" in bad.json()["detail"]
        edited = client.post(
            f"/v1/gates/{gate['gate_id']}",
            json={
                "decision": "edit",
                "by": "frank",
                "tasks": [
                    {"key": "ssm", "description": "Survey SSMs", "depends_on": ["t1"]}
                ],
            },
        )
        assert edited.status_code == 200, edited.text
        view = finished(client, run_id)
    added = view["result"]["versions"][1]["added"]
    assert len(added) == 1
    task = next(t for t in view["result"]["tasks"] if t["id"] == added[0])
    assert task["description"] == "Survey SSMs"
    assert task["status"] == "completed"


def test_a_run_waiting_at_a_gate_can_be_cancelled(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        run_id = submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        cancelled = client.post(f"/v1/runs/{run_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert client.get("/v1/gates").json()["gates"] == []
        assert client.post(f"/v1/runs/{run_id}/cancel").status_code == 409
        assert client.post("/v1/runs/nope/cancel").status_code == 404
        late = client.post(f"/v1/gates/{gate['gate_id']}", json={"decision": "approve"})
    assert late.status_code == 409
    assert late.json()["detail"] == (
        f"gate {gate['gate_id']} is closed: its run ended cancelled"
    )


async def test_a_cancel_that_reaches_a_run_as_it_ends_on_its_own_is_a_409(
    tmp_path: Path,
) -> None:
    release = anyio.Event()

    async def held(request: ModelRequest) -> Any:
        if (request.role, request.purpose) == ("executor", "execute"):
            await release.wait()
        return answer(request)

    model = ScriptedModel(held, usage=demo_usage, name="held")
    daemon = Daemon(
        settings=DaemonSettings(data_dir=tmp_path),
        token=Token("cancel-race-token-0123"),
        model=model,
    )
    looked = daemon.run_state

    async def ended_after_the_look(run_id: str) -> RunState:
        # The cancel's look finds the run running; the run then ends
        # completed before the cancel reaches it.
        state = await looked(run_id)
        daemon.run_state = looked  # type: ignore[method-assign]
        release.set()
        await daemon.supervisor.get(run_id).result()
        return state

    with anyio.fail_after(30):
        async with serving(daemon) as client:
            body = {"goal": GOAL, "gate_policy": NO_GATE}
            run_id = (await client.post("/v1/runs", json=body)).json()["run_id"]
            daemon.run_state = ended_after_the_look  # type: ignore[method-assign]
            cancelled = await client.post(f"/v1/runs/{run_id}/cancel")
            view = (await client.get(f"/v1/runs/{run_id}")).json()
    assert view["status"] == "completed"
    assert cancelled.status_code == 409, cancelled.text
    assert cancelled.json()["detail"] == f"run {run_id} already ended completed"


def test_a_run_shows_each_gate_with_the_answer_that_stands(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        approved = submit(client)
        cancelled = submit(client)
        wait_for(lambda: len(client.get("/v1/gates").json()["gates"]) == 2)
        gates = client.get("/v1/gates").json()["gates"]
        gate_of = {g["run_id"]: g["gate_id"] for g in gates}
        answer = {"decision": "approve", "by": "erin", "note": "wider is right"}
        answered = client.post(f"/v1/gates/{gate_of[approved]}", json=answer)
        assert answered.status_code == 200, answered.text
        assert client.post(f"/v1/runs/{cancelled}/cancel").status_code == 200
        finished(client, approved)
        views = {run: client.get(f"/v1/runs/{run}").json() for run in gate_of}
    (shown,) = views[approved]["gates"]
    assert shown["request"]["gate_id"] == gate_of[approved]
    assert shown["resolution"]["decision"] == "approve"
    assert (shown["resolution"]["by"], shown["resolution"]["note"]) == (
        "erin",
        "wider is right",
    )
    assert shown["resolved_at"] is not None
    (closed,) = views[cancelled]["gates"]
    assert closed["request"]["gate_id"] == gate_of[cancelled]
    assert closed["resolution"]["decision"] == "reject"
    assert closed["resolution"]["by"] == "supervisor"
    assert closed["resolution"]["note"] == (
        "the run ended before the gate was answered (cancelled)"
    )


def test_an_edit_without_tasks_is_refused_naming_the_tasks(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        url = f"/v1/gates/{gate['gate_id']}"
        no_tasks = client.post(url, json={"decision": "edit"})
        stray_tasks = client.post(url, json={"decision": "approve", "tasks": []})
        still_open = client.get("/v1/gates").json()["gates"]
    assert no_tasks.status_code == 422
    assert no_tasks.json() == {
        "detail": "tasks: an edit resolution needs the edited tasks (a plan's "
        "gate) or hypotheses (an explore review)",
        "field": "tasks",
    }
    assert stray_tasks.status_code == 422
    assert stray_tasks.json()["field"] == "tasks"
    assert "Value error" not in stray_tasks.json()["detail"]
    assert [g["gate_id"] for g in still_open] == [gate["gate_id"]]


def test_unknown_runs_are_404_naming_the_run(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for path in ("/v1/runs/nope", "/v1/runs/nope/versions", "/v1/runs/nope/events"):
            response = client.get(path)
            assert response.status_code == 404, path
            assert response.json()["field"] == "run_id"


def test_every_v1_endpoint_needs_the_bearer_token(daemon: DaemonProcess) -> None:
    endpoints = [
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs"),
        ("GET", "/v1/runs/x"),
        ("GET", "/v1/runs/x/versions"),
        ("GET", "/v1/runs/x/events"),
        ("POST", "/v1/runs/x/cancel"),
        ("GET", "/v1/gates"),
        ("POST", "/v1/gates/x"),
    ]
    with (
        httpx.Client(base_url=daemon.url) as anonymous,
        daemon.client(token="wrong-token-0123456789") as stranger,
    ):
        for method, path in endpoints:
            missing = anonymous.request(method, path, json={"goal": "g"})
            assert missing.status_code == 401, (method, path)
            assert missing.headers["www-authenticate"] == "Bearer"
            wrong = stranger.request(method, path, json={"goal": "g"})
            assert wrong.status_code == 403, (method, path)
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        # Prometheus scrapes without a token.
        metrics = anonymous.get("/metrics")
        assert metrics.status_code == 200
        assert "replan_runs_submitted_total 0" in metrics.text.splitlines()


def test_health_and_readiness_answer_head_requests_too(daemon: DaemonProcess) -> None:
    # As `curl -I` and some load balancers' checks ask: a 405 there reads
    # as a daemon that is down.
    with httpx.Client(base_url=daemon.url) as anonymous:
        for path in ("/healthz", "/readyz"):
            response = anonymous.head(path)
            assert response.status_code == 200, path
            assert response.content == b""


def test_the_token_is_checked_before_the_body_is_read(daemon: DaemonProcess) -> None:
    headers = {"content-type": "application/json"}
    with (
        httpx.Client(base_url=daemon.url) as anonymous,
        daemon.client(token="wrong-token-0123456789") as stranger,
    ):
        missing = anonymous.post("/v1/runs", content=b"{bad", headers=headers)
        wrong = stranger.post("/v1/runs", content=b"{bad", headers=headers)
        unrouted = anonymous.get("/v1/no-such-thing")
        schema = anonymous.get("/openapi.json").json()
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json() == {
        "detail": "a bearer token is required",
        "field": "authorization",
    }
    assert wrong.status_code == 403
    assert wrong.json()["field"] == "authorization"
    assert unrouted.status_code == 401
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert schema["paths"]["/v1/runs"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in schema["paths"]["/healthz"]["get"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"goal":"caf\xe9"}', "UTF-8"),
        (b'{"goal":' + b"[" * 1000 + b"]" * 1000 + b"}", "nested too deeply"),
    ],
    ids=["latin-1", "deeply-nested"],
)
def test_bodies_that_cannot_be_decoded_get_a_400_naming_the_body(
    daemon: DaemonProcess, content: bytes, reason: str
) -> None:
    headers = {"content-type": "application/json"}
    with daemon.client() as client:
        response = client.post("/v1/runs", content=content, headers=headers)
    assert response.status_code == 400
    problem = response.json()
    assert problem["field"] == "body"
    assert problem["detail"].startswith("the body is not valid JSON: ")
    assert reason in problem["detail"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"goal": 42}, "goal", "string"),
        ({"goal": "g", "pattern": "waterfall"}, "pattern", "contract"),
        ({"goal": "g", "limits": {"max_replans": -1}}, "limits.max_replans", "0"),
        ({"goal": "g", "limits": {"deadline_s": -5}}, "limits.deadline_s", "0"),
        ({"goal": "g", "limits": {"max_concurrency": "many"}}, "limits", "integer"),
        (
            {"goal": "g", "limits": {"max_replans": True}},
            "limits.max_replans",
            "true or false",
        ),
        (
            {"goal": "g", "limits": {"deadline_s": False}},
            "limits.deadline_s",
            "true or false",
        ),
        ({"goal": "   "}, "goal", "blank"),
        ({"goal": "g", "colour": "red"}, "colour", "not permitted"),
        ({"goal": "g", "kind": "survey"}, "kind", "explore"),
        (
            {
                "goal": "g",
                "kind": "explore",
                "tasks": [{"key": "a", "description": "d"}],
            },
            "tasks",
            "explore",
        ),
        (
            {
                "goal": "g",
                "tasks": [{"key": "a", "description": "d", "depends_on": ["a"]}],
            },
            "tasks",
            "cycle",
        ),
        ([1, 2], "body", "object"),
    ],
)
def test_bad_run_specs_get_a_4xx_naming_the_field(
    daemon: DaemonProcess, body: Any, field: str, words: str
) -> None:
    with daemon.client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["field"].startswith(field), problem
    assert words in problem["detail"], problem
    assert "Traceback" not in response.text


def test_malformed_json_and_oversized_bodies_are_refused(daemon: DaemonProcess) -> None:
    headers = {"content-type": "application/json"}
    with daemon.client() as client:
        broken = client.post("/v1/runs", content=b'{"goal": "g"', headers=headers)
        assert broken.status_code == 400
        assert broken.json()["field"] == "body"
        assert "JSON" in broken.json()["detail"]

        huge = json.dumps({"goal": "g" * 2_000_000}).encode()
        too_big = client.post("/v1/runs", content=huge, headers=headers)
        assert too_big.status_code == 413
        assert too_big.json()["field"] == "body"

        def chunks() -> Any:
            yield b'{"goal": "'
            for _ in range(40):
                yield b"g" * 65_536
            yield b'"}'

        streamed = client.post("/v1/runs", content=chunks(), headers=headers)
        assert streamed.status_code == 413

        empty = client.post("/v1/runs", headers=headers)
        assert empty.status_code == 422
        assert empty.json()["field"] == "body"

        for params in ({"limit": 0}, {"limit": "ten"}, {"offset": -1}, {"status": "x"}):
            response = client.get("/v1/runs", params=params)
            assert response.status_code == 422, params
            assert response.json()["field"].startswith(next(iter(params)))
        bad_id = client.get("/v1/runs/x/events", headers={"Last-Event-ID": "abc"})
        assert bad_id.status_code in (400, 404)


def test_openapi_and_metrics_are_published(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        schema = client.get("/openapi.json").json()
        run_id = submit(client, gate_policy=NO_GATE)
        view = finished(client, run_id)
        metrics = client.get("/metrics")
    paths = set(schema["paths"])
    assert {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/versions",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/cancel",
        "/v1/gates",
        "/v1/gates/{gate_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = metrics.text.splitlines()
    assert "replan_runs_submitted_total 1" in lines
    assert 'replan_actor_workers{role="executor"} 32' in lines
    assert "# TYPE replan_actor_mailbox_depth gauge" in lines
    assert 'replan_actor_waiting_for_people{role="executor"} 0' in lines
    assert "replan_ready 1" in lines
    # What the runs did, counted however many finished runs it keeps.
    assert view["status"] == "completed"
    assert 'replan_runs_ended_total{status="completed"} 1' in lines
    assert 'replan_runs_ended_total{status="failed"} 0' in lines
    assert 'replan_replans_total{trigger="scope_shift",outcome="applied"} 1' in lines
    executor_in = view["result"]["usage"]["by_role"]["executor"]["input_tokens"]
    assert executor_in > 0
    assert f'replan_tokens_total{{role="executor",type="input"}} {executor_in}' in lines
    assert "# TYPE replan_tokens_total counter" in lines


def test_metrics_count_the_gates_waiting_and_the_event_streams_open(
    daemon: DaemonProcess,
) -> None:
    def gauges(client: httpx.Client) -> tuple[str, str]:
        lines = client.get("/metrics").text.splitlines()
        [gates] = [line for line in lines if line.startswith("replan_gates_pending ")]
        [streams] = [line for line in lines if line.startswith("replan_event_streams ")]
        return gates, streams

    with daemon.client() as client:
        run_id = submit(client)
        wait_for(lambda: client.get("/v1/gates").json()["gates"])
        with client.stream("GET", f"/v1/runs/{run_id}/events") as stream:
            # Read while iterating: leaving the loop closes the stream.
            for line in stream.iter_lines():
                if line == "event: gate_opened":
                    while_open = gauges(client)
                    break
        wait_for(lambda: gauges(client)[1] == "replan_event_streams 0")
        assert client.post(f"/v1/runs/{run_id}/cancel").status_code == 200
        after = gauges(client)
    assert while_open == ("replan_gates_pending 1", "replan_event_streams 1")
    assert after == ("replan_gates_pending 0", "replan_event_streams 0")


def test_workers_sets_each_role_s_global_concurrency(tmp_path: Path) -> None:
    args = ("--workers", "executor=3", "--workers", "planner=2")
    process = DaemonProcess(tmp_path / "data", *args).start()
    try:
        with process.client() as client:
            lines = client.get("/metrics").text.splitlines()
    finally:
        process.close()
    assert 'replan_actor_workers{role="executor"} 3' in lines
    assert 'replan_actor_workers{role="planner"} 2' in lines


def test_last_event_id_is_bounded_like_after_before_the_stream_starts(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first = DaemonProcess(data).start()
    try:
        with first.client() as client:
            run_id = submit(client, gate_policy=NO_GATE)
            finished(client, run_id)
        assert first.terminate() == 0
    finally:
        first.close()
    # A new process reads the finished run from the journal.
    second = DaemonProcess(data).start()
    try:
        url = f"/v1/runs/{run_id}/events"
        with second.client() as client:
            refused = {
                value: client.get(url, headers={"Last-Event-ID": value})
                for value in (
                    "9223372036854775808",
                    "1000000001",
                    "-1",
                    "abc",
                    "1" * 25,
                    "0" * 25,
                )
            }
            last = client.get(url, headers={"Last-Event-ID": "1000000000"})
            replayed = client.get(url, headers={"Last-Event-ID": "0"})
    finally:
        second.close()
    for value, response in refused.items():
        assert response.status_code == 400, (value, response.text)
        assert response.json()["field"] == "last-event-id"
        assert "1000000000" in response.json()["detail"]
    assert last.status_code == 200
    assert last.text == ""
    assert replayed.text.count("event: ") > 5
    assert "OverflowError" not in second.output()


# Bodies the journal could not keep -------------------------------------------

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "content",
    [
        b'{"goal": "g", "context": ["\\udfff"]}',
        b'{"goal": "g", "metadata": {"\\udc00": 1}}',
        b'{"goal": "g", "metadata": {"note": "half \\ud800 a character"}}',
    ],
    ids=["context", "metadata-key", "metadata-value"],
)
def test_a_lone_surrogate_in_a_run_spec_is_a_400_naming_the_body(
    daemon: DaemonProcess, content: bytes
) -> None:
    with daemon.client() as client:
        response = client.post("/v1/runs", content=content, headers=JSON)
        runs = client.get("/v1/runs").json()["runs"]
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "body"
    assert response.json()["detail"].startswith("the body is not valid JSON: ")
    assert runs == []


@pytest.mark.parametrize("by", ["", "   "])
def test_an_answer_that_names_no_one_is_refused_naming_by(
    daemon: DaemonProcess, by: str
) -> None:
    # The journal keeps who decided each gate: an answer must say who.
    with daemon.client() as client:
        submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        url = f"/v1/gates/{gate['gate_id']}"
        refused = client.post(url, json={"decision": "approve", "by": by})
        still_open = client.get("/v1/gates").json()["gates"]
    assert refused.status_code == 422, refused.text
    assert refused.json() == {
        "detail": f"gate {gate['gate_id']}: by: name who decides"
        " (the journal keeps it)",
        "field": "by",
    }
    assert [g["gate_id"] for g in still_open] == [gate["gate_id"]]


def test_a_lone_surrogate_in_a_gate_answer_is_refused_and_the_gate_stays_open(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        run_id = submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        url = f"/v1/gates/{gate['gate_id']}"
        refused = [
            client.post(url, content=content, headers=JSON)
            for content in (
                b'{"decision": "approve", "by": "\\udfff"}',
                b'{"decision": "reject", "note": "\\udfff"}',
            )
        ]
        still_open = client.get("/v1/gates").json()["gates"]
        cancel = client.post(f"/v1/runs/{run_id}/cancel")
    for response in refused:
        assert response.status_code == 400, response.text
        assert response.json()["field"] == "body"
    assert [g["gate_id"] for g in still_open] == [gate["gate_id"]]
    # The run still waits at its gate, so a cancel really cancels it.
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["status"] == "cancelled"
    assert "Traceback" not in daemon.output()


def test_a_token_budget_past_any_float_is_a_422_naming_it(
    daemon: DaemonProcess,
) -> None:
    # Valid JSON; once accepted it crashed the run's driver at its first
    # replan guard and kept a place among the active runs for good.
    body = b'{"goal": "g", "limits": {"token_budget": 1' + b"0" * 400 + b"}}"
    with daemon.client() as client:
        refused = client.post("/v1/runs", content=body, headers=JSON)
        runs = client.get("/v1/runs").json()["runs"]
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "limits.token_budget"
    assert runs == []


def nested(depth: int) -> dict[str, Any]:
    """Metadata whose objects and arrays nest ``depth`` levels deep."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"deep": value}


def test_metadata_nested_past_the_limit_is_a_422_naming_the_metadata(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        deep = client.post("/v1/runs", json={"goal": "g", "metadata": nested(33)})
        deeper = client.post("/v1/runs", json={"goal": "g", "metadata": nested(200)})
        runs = client.get("/v1/runs").json()["runs"]
    assert deep.status_code == 422, deep.text
    assert deep.json()["field"] == "metadata"
    assert "32 levels" in deep.json()["detail"]
    assert deeper.status_code in (400, 422), deeper.text
    assert deeper.json()["field"] in ("body", "metadata")
    assert runs == []


def test_a_number_json_cannot_hold_in_metadata_is_named_by_its_path(
    daemon: DaemonProcess,
) -> None:
    bodies = [
        b'{"goal": "g", "metadata": {"a": [1, {"b": 1e400}]}}',
        # A key that is also the name of a JSON type.
        b'{"goal": "g", "metadata": {"float": -1e999}}',
    ]
    with daemon.client() as client:
        headers = {"content-type": "application/json"}
        answers = [client.post("/v1/runs", content=b, headers=headers) for b in bodies]
    assert [a.status_code for a in answers] == [422, 422]
    assert [a.json()["field"] for a in answers] == ["metadata.a.1.b", "metadata.float"]
    assert "not a finite number" in answers[0].json()["detail"]


def test_metadata_at_the_depth_limit_is_streamed_back_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    metadata = nested(32)
    first = DaemonProcess(tmp_path / "data").start()
    try:
        with first.client() as client:
            run_id = submit(client, metadata=metadata)
            wait_for(lambda: client.get("/v1/gates").json()["gates"])
        assert first.terminate() == 0
    finally:
        first.close()
    # The run waits at its gate: the next daemon must read it back to resume.
    second = DaemonProcess(tmp_path / "data").start()
    try:
        with second.client() as client:
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            approved = client.post(
                f"/v1/gates/{gate['gate_id']}", json={"decision": "approve"}
            )
            assert finished(client, run_id)["status"] == "completed"
            stream = client.get(f"/v1/runs/{run_id}/events")
    finally:
        second.close()
    assert approved.status_code == 200, approved.text
    frames = [f for f in stream.text.split("\n\n") if f.startswith("id:")]
    submitted = json.loads(frames[0].split("data: ", 1)[1])
    assert submitted["kind"] == "run_submitted"
    assert submitted["spec"]["metadata"] == metadata
    assert "event: run_finished" in frames[-1]


def test_a_run_whose_results_cannot_be_journaled_fails_saying_why(
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(
        tmp_path / "data", "--model", "python:unstorable_model:model"
    ).start()
    try:
        with daemon.client() as client:
            run_id = submit(client, gate_policy=NO_GATE)
            view = finished(client, run_id)
            cancel = client.post(f"/v1/runs/{run_id}/cancel")
    finally:
        daemon.close()
    assert view["status"] == "failed"
    reason = view["result"]["stop_reason"]
    assert reason.startswith("an event could not be journaled: ")
    assert "crashed" not in daemon.output()
    assert cancel.status_code == 409, cancel.text
    assert cancel.json()["detail"] == f"run {run_id} already ended failed"


# Two people, one gate --------------------------------------------------------


def test_of_two_answers_at_once_one_gets_200_and_the_other_409(
    daemon: DaemonProcess,
) -> None:
    async def both(gate_id: str) -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        async with httpx.AsyncClient(
            base_url=daemon.url, headers=headers, timeout=10
        ) as client:
            answers: list[httpx.Response] = []

            async def answer(by: str) -> None:
                body = {"decision": "approve", "by": by}
                answers.append(await client.post(f"/v1/gates/{gate_id}", json=body))

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer, "alice")
                tg.start_soon(answer, "bob")
            return answers

    with daemon.client() as client:
        run_ids = [submit(client) for _ in range(5)]
        for run_id in run_ids:
            (gate,) = wait_for(
                lambda run_id=run_id: client.get(
                    "/v1/gates", params={"run_id": run_id}
                ).json()["gates"]
            )
            answers = anyio.run(both, gate["gate_id"])
            codes = sorted(r.status_code for r in answers)
            assert codes == [200, 409], [r.text for r in answers]
            (winner,) = [r for r in answers if r.status_code == 200]
            (loser,) = [r for r in answers if r.status_code == 409]
            by = "alice" if winner.request.content.find(b"alice") > 0 else "bob"
            assert loser.json() == {
                "detail": f"gate {gate['gate_id']} is already resolved "
                f"(approve by {by})",
                "field": None,
            }


def test_a_late_second_answer_gets_409_naming_the_answer_that_stands(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        url = f"/v1/gates/{gate['gate_id']}"
        first = client.post(url, json={"decision": "reject", "by": "alice"})
        second = client.post(url, json={"decision": "approve", "by": "bob"})
    assert first.status_code == 200, first.text
    assert second.status_code == 409, second.text
    assert second.json() == {
        "detail": f"gate {gate['gate_id']} is already resolved (reject by alice)",
        "field": None,
    }


def test_an_edit_with_hypotheses_at_a_replan_gate_names_the_hypotheses(
    daemon: DaemonProcess,
) -> None:
    with daemon.client() as client:
        submit(client)
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        url = f"/v1/gates/{gate['gate_id']}"
        hypotheses = client.post(
            url, json={"decision": "edit", "hypotheses": [{"statement": "x"}]}
        )
        tasks = client.post(
            url,
            json={
                "decision": "edit",
                "tasks": [{"key": "e", "description": "d", "depends_on": ["ghost"]}],
            },
        )
    assert hypotheses.status_code == 422, hypotheses.text
    assert hypotheses.json()["field"] == "hypotheses"
    assert tasks.status_code == 422, tasks.text
    assert tasks.json()["field"] == "tasks"


def test_submissions_past_max_active_runs_get_429_until_a_run_ends(
    tmp_path: Path,
) -> None:
    # The demo's runs wait at a gate: two of them hold both places.
    process = DaemonProcess(tmp_path / "data", "--max-active-runs", "2").start()
    try:
        with process.client() as client:
            first, _ = submit(client), submit(client)
            refused = client.post("/v1/runs", json={"goal": GOAL})
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "5"
            assert "max_active_runs" in refused.json()["detail"]
            assert "replan_runs_refused_total 1" in client.get("/metrics").text

            assert client.post(f"/v1/runs/{first}/cancel").status_code == 200
            submit(client)  # a place is free again
    finally:
        process.close()


def test_a_side_effect_tool_call_waits_for_its_gate_over_http(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from replan.cli import main

    outbox = tmp_path / "outbox"
    process = DaemonProcess(
        tmp_path / "data",
        "--model",
        "python:mail_tools:model",
        "--tool",
        "mail_tools:send_email",
        env={"REPLAN_TEST_OUTBOX": str(outbox)},
    ).start()
    try:
        with process.client() as client:
            run_id = submit(client, gate_policy=NO_GATE)
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            assert not outbox.exists()  # nothing sent before a person agrees
            assert gate["task_id"] == "t1"
            assert gate["tool_call"]["name"] == "send_email"
            assert json.loads(gate["tool_call"]["arguments"]) == {"to": "ana"}
            # The attempt waiting for a person stands its worker aside: it is
            # counted apart from the busy ones.
            waiting = 'replan_actor_waiting_for_people{role="executor"} 1'

            def executor_metrics() -> list[str] | None:
                lines = [
                    line
                    for line in client.get("/metrics").text.splitlines()
                    if line.startswith("replan_actor_") and 'role="executor"' in line
                ]
                return lines if waiting in lines else None

            metrics = wait_for(executor_metrics)
            assert 'replan_actor_busy{role="executor"} 0' in metrics
            answer = client.post(
                f"/v1/gates/{gate['gate_id']}",
                json={"decision": "approve", "by": "erin"},
            )
            assert answer.status_code == 200, answer.text
            view = finished(client, run_id)
        monkeypatch.setenv("REPLAN_URL", process.url)
        monkeypatch.setenv("REPLAN_API_TOKEN", process.token or "")
        capsys.readouterr()
        assert main(["show", run_id]) == 0
        remote_report = capsys.readouterr().out
        journal = str(process.data_dir / "journal.db")
        assert main(["show", run_id, "--db", journal]) == 0
        local_report = capsys.readouterr().out
    finally:
        process.close()
    assert view["status"] == "completed"
    assert outbox.read_text() == f"ana {run_id}:t1:s1c0\n"
    assert view["side_effects"] == [
        {
            "key": f"{run_id}:t1:s1c0",
            "task_id": "t1",
            "tool": "send_email",
            "arguments": {"to": "ana"},
            "content": "sent to ana",
        }
    ]
    assert remote_report == local_report
    assert "side effects\n  t1  send_email" in remote_report


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ("nowhere:send", "replan: error: tools: cannot import nowhere:send: "),
        ("mail_tools", "replan: error: tools: use module:name, not 'mail_tools'"),
        ("mail_tools:NOT_A_TOOL", "replan: error: tools: mail_tools:NOT_A_TOOL: int"),
    ],
)
def test_a_tool_the_daemon_cannot_use_is_one_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    problem: str,
) -> None:
    from daemon_process import HERE

    from replan.cli import main

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv("REPLAN_API_TOKEN", raising=False)
    code = main(["serve", "--tool", tool, "--data-dir", str(tmp_path), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(problem)
    assert len(err.splitlines()) == 1
    # A first start that fails leaves no token behind that it never showed.
    assert not (tmp_path / "api-token").exists()
