"""The command line as a client of a real daemon subprocess."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_process import DaemonProcess, wait_for

from replan import _client, _remote
from replan._client import Backoff, ClientError
from replan._demo import GOAL
from replan._demo_explore import explore_demo_spec
from replan.cli import main


@pytest.fixture
def remote(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> DaemonProcess:
    monkeypatch.setenv("REPLAN_URL", daemon.url)
    monkeypatch.setenv("REPLAN_API_TOKEN", daemon.token or "")
    return daemon


def test_submit_watch_runs_and_show_against_a_daemon(
    remote: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"goal": GOAL, "gate_policy": {"gate_on": []}}))
    assert main(["submit", str(spec), "--watch"]) == 0
    out = capsys.readouterr().out.splitlines()
    run_id = out[0]
    assert out[-1] == "run finished: completed"
    assert any(line.startswith("replan applied (scope_shift)") for line in out)

    assert main(["runs"]) == 0
    listed = capsys.readouterr().out
    assert run_id in listed
    assert "completed" in listed

    assert main(["show", run_id]) == 0
    remote_report = capsys.readouterr().out
    assert main(["show", run_id, "--db", str(remote.data_dir / "journal.db")]) == 0
    local_report = capsys.readouterr().out
    assert remote_report == local_report
    assert "plan versions" in remote_report

    # A unique prefix names the run, as it does with --db.
    assert main(["show", run_id[:6]]) == 0
    assert capsys.readouterr().out == remote_report
    assert main(["watch", run_id[:6]]) == 0  # the id show printed, shortened
    assert capsys.readouterr().out.splitlines()[-1] == "run finished: completed"
    assert main(["watch", "zz"]) == 1
    assert capsys.readouterr().err == "replan: error: 404: no run zz\n"
    assert main(["show", "zz"]) == 1
    assert capsys.readouterr().err == "replan: error: 404: no run zz\n"


def test_watch_exits_1_when_the_run_does_not_complete(
    remote: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As replan run does: a script can tell a run that completed from one
    # that did not by the exit status alone.
    assert main(["submit", "--goal", GOAL]) == 0
    run_id = capsys.readouterr().out.strip()
    assert main(["cancel", run_id]) == 0
    capsys.readouterr()
    assert main(["watch", run_id]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith("run finished: cancelled")
    assert captured.err == (
        f"replan: error: run {run_id} ended cancelled: cancelled on request\n"
    )

    spec = tmp_path / "spec.json"
    limited = {"max_task_executions": 1}
    spec.write_text(
        json.dumps({"goal": GOAL, "limits": limited, "gate_policy": {"gate_on": []}})
    )
    assert main(["submit", str(spec), "--watch"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("replan: error: run ")
    assert "ended limit_reached: max_task_executions" in err


@pytest.mark.parametrize("command", ["approve", "reject"])
def test_gates_are_answered_and_runs_cancelled_from_the_command_line(
    remote: DaemonProcess, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", "--goal", GOAL]) == 0
    run_id = capsys.readouterr().out.strip()
    with remote.client() as client:
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
        assert main([command, gate["gate_id"], "--by", "gina"]) == 0
        assert capsys.readouterr().out.startswith(f"gate {gate['gate_id']}: {command}")
        assert main(["watch", run_id]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "run finished: completed"
        outcome = client.get(f"/v1/runs/{run_id}").json()["result"]["replans"][0]
    expected = "applied" if command == "approve" else "rejected_by_human"
    assert outcome["outcome"] == expected

    assert main(["submit", "--goal", GOAL]) == 0
    waiting = capsys.readouterr().out.strip()
    with remote.client() as client:
        wait_for(lambda: client.get("/v1/gates").json()["gates"])
    assert main(["cancel", waiting]) == 0
    assert capsys.readouterr().out.strip() == f"run {waiting}: cancelled"


def test_the_gate_id_show_prints_is_the_one_approve_takes(
    remote: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    run_ids = []
    for _ in range(2):
        assert main(["submit", "--goal", GOAL]) == 0
        run_ids.append(capsys.readouterr().out.strip())
    with remote.client() as client:
        wait_for(lambda: len(client.get("/v1/gates").json()["gates"]) == 2)

    assert main(["show", run_ids[0]]) == 0
    shown = [
        line.split()[1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("gate ")
    ]
    assert shown == [f"{run_ids[0]}-g1"]
    assert main(["reject", shown[0]]) == 0
    assert capsys.readouterr().out.startswith(f"gate {shown[0]}: reject")

    # The short id names the gate when only one waiting gate has it.
    assert main(["submit", "--goal", GOAL]) == 0
    third = capsys.readouterr().out.strip()
    with remote.client() as client:
        wait_for(lambda: len(client.get("/v1/gates").json()["gates"]) == 2)
    assert main(["approve", "g1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replan: error: gate g1 is waiting in 2 runs: give its")
    assert main(["cancel", third]) == 0
    assert main(["approve", "g1", "--by", "gina"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out == f"gate {run_ids[1]}-g1: approve (run {run_ids[1]})"
    assert main(["approve", "g7"]) == 1
    assert capsys.readouterr().err == "replan: error: 404: no gate g7\n"

    assert main(["watch", run_ids[1]]) == 0
    watched = capsys.readouterr().out
    assert f"gate {run_ids[1]}-g1 opened" in watched
    assert f"gate {run_ids[1]}-g1 resolved: approve by gina" in watched


def test_gates_lists_the_gates_waiting_for_a_person_by_the_ids_approve_takes(
    remote: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gates"]) == 0
    assert capsys.readouterr().err == "no gates waiting\n"
    run_ids = []
    for _ in range(2):
        assert main(["submit", "--goal", GOAL]) == 0
        run_ids.append(capsys.readouterr().out.strip())
    with remote.client() as client:
        wait_for(lambda: len(client.get("/v1/gates").json()["gates"]) == 2)

    assert main(["gates"]) == 0
    listed = capsys.readouterr().out
    opened = [
        line.split()[1] for line in listed.splitlines() if line.startswith("gate ")
    ]
    assert sorted(opened) == sorted(f"{run_id}-g1" for run_id in run_ids)
    assert "scope_shift" in listed  # what it asks, with the proposed diff
    assert main(["gates", "--run", run_ids[1]]) == 0
    only = capsys.readouterr().out
    assert only.startswith(f"gate {run_ids[1]}-g1 opened: waiting for a decision")
    assert run_ids[0] not in only
    # A prefix names the run as for show; one that names no run says so.
    assert main(["gates", "--run", run_ids[1][:12]]) == 0
    assert capsys.readouterr().out == only
    for unknown in ("NOSUCH", "0" * 40):
        assert main(["gates", "--run", unknown]) == 1
        assert capsys.readouterr().err == f"replan: error: 404: no run {unknown}\n"

    assert main(["approve", opened[0], "--by", "gina"]) == 0
    capsys.readouterr()
    assert main(["gates"]) == 0
    left = [
        line.split()[1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("gate ")
    ]
    assert left == opened[1:]


class _GateList:
    """A daemon's answer to ``GET /v1/gates`` on a shared journal."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        assert (method, path) == ("GET", "/v1/gates")
        return self.answer


def test_gates_names_the_daemon_to_answer_a_gate_another_drives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gate = {
        "gate_id": "r1-g2",
        "run_id": "r1",
        "reason": "task t1 asks to run the tool send_email",
        "created_at": "2026-01-01T00:00:00Z",
    }
    client = _GateList({"gates": [gate], "elsewhere": {"r1-g2": "host-b:4242"}})
    args = argparse.Namespace(run_id=None)
    assert _remote._gates(client, args) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gate r1-g2 opened: waiting for a decision"
    assert (
        out[-1]
        == "    its run is driven by daemon host-b:4242; any daemon takes the answer"
    )


def test_show_lists_the_hypotheses_an_explore_review_gate_asks_about(
    remote: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "explore.json"
    spec.write_text(explore_demo_spec().model_dump_json(exclude_defaults=True))
    assert main(["submit", str(spec)]) == 0
    run_id = capsys.readouterr().out.strip()
    with remote.client() as client:
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])

    # The person asked to approve the selection from another terminal sees it.
    assert main(["show", run_id]) == 0
    shown = capsys.readouterr().out
    assert f"gate {gate['gate_id']} opened: waiting for a decision" in shown
    assert "    selection under review:" in shown
    for hypothesis in gate["hypotheses"]:
        first_words = " ".join(hypothesis["statement"].split()[:4])
        assert f"    {hypothesis['id']:<5}{first_words}" in shown
    # An explore run has no tasks nor plan versions to list.
    assert "\ntasks\n" not in shown
    assert "plan versions" not in shown


@pytest.mark.parametrize("stop", ["drain", "crash"])
def test_watch_follows_a_run_across_a_daemon_restart(
    remote: DaemonProcess,
    stop: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        _client, "DEFAULT_BACKOFF", Backoff(first_s=0.05, max_s=0.5, total_s=60)
    )
    assert main(["submit", "--goal", GOAL]) == 0
    run_id = capsys.readouterr().out.strip()
    codes: list[int] = []
    watch = threading.Thread(target=lambda: codes.append(main(["watch", run_id])))
    watch.start()
    try:
        seen = _wait_for_output(capsys, "waiting for a decision")
        if stop == "drain":
            assert remote.terminate() == 0
        else:
            remote.kill()
        remote.start()
        with remote.client() as client:
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            answer = {"decision": "approve", "by": "gina"}
            client.post(f"/v1/gates/{gate['gate_id']}", json=answer).raise_for_status()
        watch.join(60)
        assert not watch.is_alive(), "watch did not follow the restarted daemon"
    finally:
        remote.close()
        watch.join(60)
    captured = capsys.readouterr()
    lines = (seen + captured.out).splitlines()
    assert codes == [0], captured.err
    assert lines[-1] == "run finished: completed"
    assert any(line.startswith("replan applied (scope_shift)") for line in lines)
    assert lines.count(lines[0]) == 1  # nothing is printed twice on reconnecting


def test_submit_waits_for_a_daemon_that_restarts_and_starts_one_run(
    remote: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        _client, "DEFAULT_BACKOFF", Backoff(first_s=0.05, max_s=0.5, total_s=60)
    )
    remote.kill()
    codes: list[int] = []
    submit = threading.Thread(
        target=lambda: codes.append(main(["submit", "--goal", GOAL, "--watch"]))
    )
    submit.start()
    try:
        time.sleep(0.5)  # refused meanwhile, and sent again
        remote.start()
        with remote.client() as client:
            (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
            answer = {"decision": "approve", "by": "gina"}
            client.post(f"/v1/gates/{gate['gate_id']}", json=answer).raise_for_status()
            submit.join(60)
            runs = client.get("/v1/runs").json()["runs"]
    finally:
        remote.close()
        submit.join(60)
    captured = capsys.readouterr()
    assert codes == [0], captured.err
    assert [r["run_id"] for r in runs] == [captured.out.splitlines()[0]]


def test_sigterm_ends_watch_with_one_line_and_exit_143(
    remote: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As it ends a local run: docker stop, timeout, a CI runner's cancel.
    assert main(["submit", "--goal", GOAL]) == 0
    run_id = capsys.readouterr().out.strip()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "replan", "watch", run_id],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + 30
            while "waiting for a decision" not in out.read_text():
                assert time.monotonic() < deadline, "watch printed nothing"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(10)
        finally:
            proc.kill()
            proc.wait()
    assert code == 143
    assert err.read_text() == "replan: terminated\n"


def _wait_for_output(
    capsys: pytest.CaptureFixture[str], text: str, seconds: float = 30
) -> str:
    seen = ""
    deadline = time.monotonic() + seconds
    while text not in seen:
        assert time.monotonic() < deadline, f"never printed {text!r}: {seen}"
        time.sleep(0.02)
        seen += capsys.readouterr().out
    return seen


def test_client_errors_are_one_line(
    remote: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["approve", "no-such-gate"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "replan: error: 404: no gate no-such-gate"
    monkeypatch.setenv("REPLAN_API_TOKEN", "wrong-token-0123456789")
    assert main(["runs"]) == 1
    assert capsys.readouterr().err.startswith("replan: error: 403")
    monkeypatch.setenv("REPLAN_URL", "http://127.0.0.1:9")
    assert main(["cancel", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("replan: error: cannot reach http://127.0.0.1:9")
    assert len(err.strip().splitlines()) == 1


def test_a_missing_token_says_which_variable_to_set(
    remote: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REPLAN_API_TOKEN")
    assert main(["runs"]) == 2  # a setting is missing, as a model's key is
    err = capsys.readouterr().err
    assert err == (
        "replan: error: 401: a bearer token is required: set REPLAN_API_TOKEN "
        "to the daemon's token\n"
    )


def test_a_spec_the_daemon_refuses_is_a_bad_argument(
    remote: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 2 as for a spec the command itself refuses (NaN), not 1 as for a
    # daemon that failed: the daemon's 422 names the field to change.
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"goal": GOAL, "limits": {"max_replans": -1}}))
    assert main(["submit", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replan: error: 422: limits.max_replans: ")
    # A blank --goal is the goal given, refused as blank: not taken for no
    # --goal at all, nor left out in favour of the spec file's goal.
    spec.write_text(json.dumps({"goal": GOAL}))
    for argv in (["--goal", ""], [str(spec), "--goal", ""]):
        assert main(["submit", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("replan: error: 422: goal: ")
    assert main(["submit", "--goal", GOAL]) == 0
    capsys.readouterr()
    with remote.client() as client:
        (gate,) = wait_for(lambda: client.get("/v1/gates").json()["gates"])
    assert main(["approve", gate["gate_id"], "--by", " "]) == 2
    assert capsys.readouterr().err.startswith("replan: error: 422: gate ")


def test_a_demo_into_the_journal_a_daemon_serves_is_refused_in_one_line(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = daemon.data_dir / "journal.db"
    assert main(["demo", "--yes", "--db", str(journal)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"replan: error: store: another supervisor is resuming runs in {journal} "
        "and needs the journal to itself\n"
    )


class _Pages:
    """A daemon's run listing, three runs to a page (what the API answers)."""

    def __init__(self, run_ids: list[str]) -> None:
        self.run_ids = run_ids
        self.pages = 0

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        if path != "/v1/runs":
            run_id = path.rsplit("/", 1)[-1]
            if run_id in self.run_ids:
                return {"run_id": run_id}
            raise ClientError(f"404: no run {run_id}", 404)
        self.pages += 1
        offset = kwargs["params"]["offset"]
        more = offset + 3 < len(self.run_ids)
        return {
            "runs": [{"run_id": r} for r in self.run_ids[offset : offset + 3]],
            "next_offset": offset + 3 if more else None,
        }


def test_a_prefix_is_looked_up_over_every_page_of_runs() -> None:
    pages = _Pages(["a1", "b2", "c3", "d4", "e5", "ab6", "f7"])

    assert _remote._find_run(pages, "e")[0] == "e5"  # type: ignore[arg-type]
    assert pages.pages == 3
    with pytest.raises(ClientError, match="run id prefix a matches 2 runs"):
        _remote._find_run(pages, "a")  # type: ignore[arg-type]
    assert _remote._find_run(pages, "a1") == ("a1", {"run_id": "a1"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("limit", "pages"), [(5, 2), (7, 3), (100, 3), (1, 1)])
def test_runs_lists_as_many_runs_as_its_limit_over_every_page(
    limit: int, pages: int
) -> None:
    daemon = _Pages(["a1", "b2", "c3", "d4", "e5", "ab6", "f7"])

    listed = _remote._newest_runs(daemon, limit)  # type: ignore[arg-type]

    assert [r["run_id"] for r in listed] == daemon.run_ids[:limit]
    assert daemon.pages == pages


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"goal": "\\udfff"}', "goal holds a lone UTF-16 surrogate escape"),
        (
            '{"goal": "g", "metadata": {"a": ["\\ud800"]}}',
            "metadata.a.0 holds a lone UTF-16 surrogate escape",
        ),
        ('{"goal": "g", "metadata": {"\\udc00": 1}}', "metadata has a key with"),
        (
            '{"goal": "g", "metadata": ' + "[" * 5000 + "]" * 5000 + "}",
            "it nests too deeply",
        ),
    ],
    ids=["goal", "nested", "key", "deep"],
)
def test_a_spec_json_text_cannot_carry_is_a_bad_argument_naming_the_field(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(text)
    # Refused before any request: nothing listens at this address.
    assert main(["submit", str(spec), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"replan: error: cannot read the spec {spec}: {message}")
    assert err.count("\n") == 1
