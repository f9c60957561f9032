"""What ``replan serve`` refuses before it opens the journal or resumes a run."""

from __future__ import annotations

import socket
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from counting_model import read_counts
from daemon_process import TOKEN, DaemonProcess, refusing_port, wait_for

from replan import ConfigurationError
from replan._demo import GOAL
from replan.cli import main
from replan.daemon import DaemonSettings
from replan.daemon._listen import listen
from replan.daemon._lock import data_dir_lock
from replan.daemon._server import GC_YOUNG_THRESHOLD, TELEMETRY_FLUSH_S

COUNTING = ("--model", "python:counting_model:model")


def journal_rows(data_dir: Path) -> list[tuple[str, int, str]]:
    with closing(sqlite3.connect(data_dir / "journal.db")) as conn:
        rows: list[tuple[str, int, str]] = conn.execute(
            "SELECT run_id, seq, type FROM events ORDER BY run_id, seq"
        ).fetchall()
    return rows


@pytest.fixture
def counting_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The counting model's settings, here and in daemon subprocesses."""
    env = {
        "REPLAN_TEST_COUNT_FILE": str(tmp_path / "executions.txt"),
        "REPLAN_TEST_EXECUTE_S": "30",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REPLAN_API_TOKEN", TOKEN)
    return env


@pytest.fixture
def interrupted_run(tmp_path: Path, counting_env: dict[str, str]) -> Path:
    """A data directory whose journal holds a run killed mid-task."""
    data = tmp_path / "data"
    daemon = DaemonProcess(data, *COUNTING, env=counting_env).start()
    try:
        with daemon.client() as client:
            response = client.post(
                "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
            )
            assert response.status_code == 202, response.text
            wait_for(lambda: read_counts(counting_env["REPLAN_TEST_COUNT_FILE"])[1])
        daemon.kill()
    finally:
        daemon.close()
    return data


def serve_args(data: Path, port: int) -> list[str]:
    return ["serve", "--data-dir", str(data), "--port", str(port), *COUNTING]


def test_a_second_daemon_on_the_same_data_dir_is_refused(
    tmp_path: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    first = DaemonProcess(data, *COUNTING, env=counting_env).start()
    try:
        with first.client() as client:
            response = client.post("/v1/runs", json={"goal": GOAL})
            assert response.status_code == 202, response.text
            wait_for(lambda: read_counts(counting_env["REPLAN_TEST_COUNT_FILE"])[1])
        before = journal_rows(data)
        counts_before = read_counts(counting_env["REPLAN_TEST_COUNT_FILE"])

        assert main(serve_args(data, 0)) == 2

        err = capsys.readouterr().err
        assert first.proc is not None
        assert err == (
            f"replan: error: data_dir: another replan daemon is using {data} "
            f"(pid {first.proc.pid})\n"
        )
        assert journal_rows(data) == before
        assert read_counts(counting_env["REPLAN_TEST_COUNT_FILE"]) == counts_before
        with first.client() as client:
            assert client.get("/readyz").status_code == 200
    finally:
        first.close()


def test_the_lock_is_released_when_the_daemon_exits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = DaemonProcess(data).start()
    try:
        assert first.terminate() == 0
    finally:
        first.close()
    second = DaemonProcess(data).start()
    try:
        assert second.terminate() == 0
    finally:
        second.close()


def test_a_busy_port_is_refused_before_any_run_resumes(
    interrupted_run: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = journal_rows(interrupted_run)
    counts_before = read_counts(counting_env["REPLAN_TEST_COUNT_FILE"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        assert main(serve_args(interrupted_run, port)) == 2

    assert capsys.readouterr().err == (
        f"replan: error: port: 127.0.0.1:{port} is in use\n"
    )
    assert journal_rows(interrupted_run) == before
    assert read_counts(counting_env["REPLAN_TEST_COUNT_FILE"]) == counts_before
    # The failed start left the lock free for the next daemon.
    with data_dir_lock(DaemonSettings(data_dir=interrupted_run)):
        pass


def test_a_held_lock_names_the_data_dir_and_the_holder(tmp_path: Path) -> None:
    settings = DaemonSettings(data_dir=tmp_path / "data")
    with data_dir_lock(settings) as path:
        with pytest.raises(ConfigurationError) as raised, data_dir_lock(settings):
            pass
        assert path.read_text().strip().isdigit()
    assert raised.value.field == "data_dir"
    assert "another replan daemon is using" in raised.value.problem
    assert not settings.journal_path.exists()


def test_a_data_dir_that_is_a_file_is_named_as_no_directory(tmp_path: Path) -> None:
    data = tmp_path / "notes.txt"
    data.write_text("not a directory")
    with (
        pytest.raises(ConfigurationError) as raised,
        data_dir_lock(DaemonSettings(data_dir=data)),
    ):
        pass
    assert raised.value.field == "data_dir"
    assert raised.value.problem == f"{data} is no directory"
    assert data.read_text() == "not a directory"


def test_listening_works_on_any_port_and_on_ipv6() -> None:
    (ipv4,) = listen("127.0.0.1", 0)
    with ipv4:
        port = ipv4.getsockname()[1]
        assert port != 0
        with pytest.raises(ConfigurationError) as raised:
            listen("127.0.0.1", port)
        assert raised.value.field == "port"
        assert raised.value.problem == f"127.0.0.1:{port} is in use"
        with socket.create_connection(("127.0.0.1", port)):
            pass  # it listens already
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        (ipv6,) = listen("::1", 0)
    except ConfigurationError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with ipv6:
        port = ipv6.getsockname()[1]
        with pytest.raises(ConfigurationError, match=rf"\[::1\]:{port} is in use"):
            listen("::1", port)


def test_a_host_that_does_not_resolve_names_the_host() -> None:
    with pytest.raises(ConfigurationError) as raised:
        listen("no-such-host.invalid", 0)
    assert raised.value.field == "host"


@pytest.mark.parametrize("host", ["x..y", "a" * 64 + ".example", "\udcff"])
def test_a_host_no_dns_name_can_carry_is_a_one_line_error(
    tmp_path: Path,
    host: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REPLAN_API_TOKEN", "t" * 20)  # to listen beyond loopback
    # A label empty or too long, or a byte no encoding takes (as the shell
    # passes a non-UTF-8 argument): a UnicodeError from getaddrinfo, which
    # the command printed as "unexpected UnicodeError", exit 1.
    args = ["serve", "--host", host, "--data-dir", str(tmp_path), "--port", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"replan: error: host: cannot resolve {host!r}: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["python:os:sep", "python:os:getcwd"])
def test_a_python_model_that_is_no_model_is_a_one_line_error(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["serve", "--model", name, "--data-dir", str(tmp_path), "--port", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"replan: error: model: {name.removeprefix('python:')} is not a model, "
        "nor a function of the settings returning one\n"
    )
    assert not (tmp_path / "journal.db").exists()


@pytest.mark.parametrize(
    ("name", "problem"),
    [("raises", "RuntimeError: no GPU left"), ("exits", "SystemExit(3)")],
)
def test_a_python_model_factory_that_fails_is_a_one_line_error_naming_the_model(
    tmp_path: Path, name: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = f"python:failing_models:{name}"
    args = ["serve", "--model", model, "--data-dir", str(tmp_path), "--port", "1"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"replan: error: model: failing_models:{name}(settings) raised {problem}\n"
    )
    assert not (tmp_path / "journal.db").exists()


def test_the_daemon_freezes_its_startup_heap_and_collects_less_often(
    tmp_path: Path,
) -> None:
    # Read inside the serving process, by the model a run calls.
    daemon = DaemonProcess(
        tmp_path / "data", "--model", "python:gc_probe_model:model"
    ).start()
    try:
        with daemon.client() as client:
            response = client.post(
                "/v1/runs", json={"goal": GOAL, "gate_policy": {"gate_on": []}}
            )
            assert response.status_code == 202, response.text
            run_id = response.json()["run_id"]

            def finished() -> dict[str, Any] | None:
                body: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
                return body if body["status"] == "completed" else None

            output = wait_for(finished)["result"]["output"]
    finally:
        daemon.close()
    young, frozen = (int(part.split("=")[1]) for part in output.split())
    assert young == GC_YOUNG_THRESHOLD
    assert frozen > 10_000  # the modules, the settings and the app


def test_what_the_runs_left_is_not_walked_by_the_collector_as_the_daemon_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interpreter's last collections walked every object thousands of
    # runs left behind: seconds between "drained" and the process's exit.
    import gc

    from replan.daemon import _server

    left: list[list[int]] = []

    def serving(settings: DaemonSettings, daemon: Any) -> None:
        # Lists, which the collector always tracks (a dict of numbers it
        # stops tracking once it has looked at it).
        left.extend([i] for i in range(50_000))

    monkeypatch.setattr(_server, "_listen_and_serve", serving)
    settings = DaemonSettings(data_dir=tmp_path, api_token=TOKEN)
    before = gc.get_freeze_count()
    try:
        _server.serve(settings)
        frozen = gc.get_freeze_count() - before
    finally:
        gc.unfreeze()
    assert frozen >= len(left)


def test_a_collector_that_is_down_holds_the_daemon_s_stop_only_briefly(
    tmp_path: Path,
) -> None:
    # Nothing listens on the collector's port. The SDK would retry each
    # signal for a minute; the daemon waits TELEMETRY_FLUSH_S, then says so.
    with refusing_port() as port:
        daemon = DaemonProcess(
            tmp_path / "data",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
            },
        ).start()
        try:
            assert daemon.terminate(timeout_s=40) == 0
        finally:
            daemon.close()
    assert (
        f"telemetry not sent within {TELEMETRY_FLUSH_S:g}s "
        "(is the OTLP collector running?)" in daemon.output()
    )


@pytest.mark.parametrize("kind", ["no-database", "a-directory"])
def test_a_journal_the_daemon_cannot_open_is_refused_in_one_line(
    tmp_path: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    # Refused by the app as it started, this was uvicorn's traceback, exit 3.
    data = tmp_path / "data"
    data.mkdir()
    journal = data / "journal.db"
    if kind == "no-database":
        journal.write_text("garbage")
    else:
        journal.mkdir()

    assert main(serve_args(data, 0)) == 2

    err = capsys.readouterr().err
    assert err.startswith(
        (
            f"replan: error: path: {journal}",
            f"replan: error: path: cannot open {journal}",
        )
    )
    assert err.count("\n") == 1
    # The failed start left the lock free for the next daemon.
    with data_dir_lock(DaemonSettings(data_dir=data)):
        pass


def test_a_journal_another_daemon_resumes_from_is_refused_in_one_line(
    tmp_path: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = DaemonProcess(tmp_path / "first", *COUNTING, env=counting_env).start()
    try:
        # A second data directory whose journal is the first one's, by a link.
        second = tmp_path / "second"
        second.mkdir()
        (second / "journal.db").symlink_to(tmp_path / "first" / "journal.db")
        assert main(serve_args(second, 0)) == 2
    finally:
        assert first.terminate() == 0
        first.close()
    err = capsys.readouterr().err
    assert err.startswith("replan: error: store: another supervisor drives runs in ")
    assert err.count("\n") == 1


def test_a_busy_port_is_refused_before_a_new_journal_is_made(
    tmp_path: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(serve_args(data, port)) == 2
    assert "is in use" in capsys.readouterr().err
    assert not (data / "journal.db").exists()


def test_a_bad_otel_value_is_refused_before_the_port_is_bound(
    tmp_path: Path,
    counting_env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "many")
    data = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        # The port is busy: refused after it was bound, the error would be
        # the port's.
        assert main(serve_args(data, busy.getsockname()[1])) == 2
    err = capsys.readouterr().err
    assert err.startswith("replan: error: OTEL_SPAN_EVENT_COUNT_LIMIT: ")
    assert err.count("\n") == 1
    assert "listening" not in err
    assert not (data / "journal.db").exists()


def test_port_0_takes_a_free_port_and_the_port_file_names_it(tmp_path: Path) -> None:
    # A port found free beforehand can be taken by another program before
    # the daemon binds it; a supervisor program starts it on port 0 and
    # reads the address it took from the port file.
    daemon = DaemonProcess(tmp_path / "data", "--log-level", "info").start()
    try:
        url = daemon.port_file.read_text()
        assert url == f"http://127.0.0.1:{daemon.port}\n"
        assert daemon.port != 0
        with daemon.client() as client:
            assert client.get("/v1/runs").status_code == 200
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert f"listening on {url.strip()}" in daemon.output()
    # Removed as it exits: a file left behind would name a port nobody
    # listens on, or another program's.
    assert not daemon.port_file.exists()


def test_a_token_file_others_may_read_is_warned_of_in_the_daemon_s_log(
    tmp_path: Path,
) -> None:
    # The warning was logged before the daemon set up its log, so the
    # library's NullHandler took it and the operator never saw it.
    data = tmp_path / "data"
    data.mkdir()
    token_file = data / "api-token"
    token_file.write_text("a-token-of-sixteen-or-more\n")
    token_file.chmod(0o644)
    daemon = DaemonProcess(data, token=None).start()
    try:
        with daemon.client("a-token-of-sixteen-or-more") as client:
            assert client.get("/v1/runs").status_code == 200  # the file's token
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert (
        f"WARNING replan.daemon: {token_file} can be read by other users "
        f"(mode 0644), and whoever reads it may use the API: chmod 600 {token_file}"
    ) in daemon.output()


@pytest.mark.parametrize("where", ["no-directory", "a-directory"])
def test_a_port_file_that_cannot_be_written_is_one_line_before_any_run_resumes(
    interrupted_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    caplog.set_level("INFO", "replan.daemon")
    before = journal_rows(interrupted_run)
    if where == "no-directory":
        # Refused with the settings: before the daemon said it listens.
        port_file = tmp_path / "no-such-dir" / "port"
        problem = f"no directory {port_file.parent} to write port in"
    else:
        port_file = tmp_path
        problem = f"cannot write {port_file}: Is a directory"

    args = [*serve_args(interrupted_run, 0), "--port-file", str(port_file)]
    assert main(args) == 2

    err = capsys.readouterr().err
    # No "listening on" line just before the error: it did not start.
    assert not [m for m in caplog.messages if "listening" in m]
    assert err.endswith(f"replan: error: port_file: {problem}\n")
    assert journal_rows(interrupted_run) == before
