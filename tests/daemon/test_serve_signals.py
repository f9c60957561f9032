"""``replan serve`` under signals, in a real process: whenever SIGTERM,
SIGINT or SIGHUP comes, the daemon stops cleanly (exit 0), never dies by it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from counting_model import read_counts
from daemon_process import DaemonProcess, wait_for
from test_durability import COUNTING, all_finished, submit

from replan.daemon._server import TELEMETRY_FLUSH_S


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_before_the_daemon_serves_stops_it_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # The start takes a while (imports, the model, the journal check)
    # before the daemon listens for signals itself: a signal then killed
    # it, exit 143 (or a KeyboardInterrupt traceback), as if it crashed.
    starting = tmp_path / "starting"
    daemon = DaemonProcess(
        tmp_path / "data",
        "--model",
        "python:slow_start_model:model",
        env={"REPLAN_TEST_STARTING_FILE": str(starting)},
    )
    with pytest.raises(RuntimeError, match="did not get ready"):
        daemon.start(timeout_s=0.1)
    try:
        wait_for(starting.exists)
        assert daemon.proc is not None
        started = time.monotonic()
        daemon.proc.send_signal(signum)
        assert daemon.proc.wait(20) == 0, daemon.output()
        assert time.monotonic() - started < 10
    finally:
        daemon.close()
    assert daemon.output().splitlines()[-1] == f"replan: stopped by {signum.name}"
    assert "Traceback" not in daemon.output()
    # The data directory's lock went with the process: a daemon starts on it.
    again = DaemonProcess(tmp_path / "data").start()
    try:
        assert again.terminate() == 0
    finally:
        again.close()


def test_a_second_signal_while_the_last_spans_are_sent_stops_at_once(
    tmp_path: Path, refused_port: int
) -> None:
    # Nothing listens on the collector's port, so the daemon waits
    # TELEMETRY_FLUSH_S for it after the drain; the event loop had put the
    # default handlers back by then, and the second SIGTERM killed it.
    daemon = DaemonProcess(
        tmp_path / "data",
        "--log-level",
        "info",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{refused_port}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
        },
    ).start()
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "drained;" in daemon.output())
        time.sleep(0.5)  # uvicorn and the event loop have stopped
        started = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(20) == 0, daemon.output()
        assert time.monotonic() - started < TELEMETRY_FLUSH_S
    finally:
        daemon.close()
    assert daemon.output().splitlines()[-1] == "replan: stopped by SIGTERM"


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads /proc/PID/status"
)


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def lock_is_free(data_dir: Path) -> bool:
    fd = os.open(data_dir / "journal.db.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@needs_proc
@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
    ids=["TERM", "INT", "HUP"],
)
def test_a_signal_while_the_command_imports_the_package_stops_it_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # Importing the package takes half a second or more, and a signal then
    # killed `replan serve` (exit 143), printed a KeyboardInterrupt
    # traceback, or (SIGHUP) killed it with 129: the command's own handlers
    # came after the imports. Python reports each import it has finished
    # (-X importtime), so the output shows where the signal came.
    daemon = DaemonProcess(
        tmp_path / "data", console_script=True, env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    with pytest.raises(RuntimeError, match="did not get ready"):
        daemon.start(timeout_s=0)
    try:
        # SIGHUP's is the last the command installs (Python's own SIGINT
        # handler is there from the interpreter's start).
        wait_for(lambda: handles(daemon.pid, signal.SIGHUP), every_s=0.001)
        assert daemon.proc is not None
        daemon.proc.send_signal(signum)
        assert daemon.proc.wait(20) == 0, daemon.output()
    finally:
        daemon.close()
    output = daemon.output()
    assert not re.search(r"\|\s+replan\.cli$", output, re.MULTILINE), (
        "the signal came once the package was imported"
    )
    assert output.splitlines()[-1] == f"replan: stopped by {signum.name}"
    assert "Traceback" not in output
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["daemon.log"]


@needs_proc
def test_sigterm_at_any_moment_of_the_start_stops_cleanly_and_loses_no_run(
    tmp_path: Path,
) -> None:
    # Runs left unfinished by a crash; then starts stopped at one moment
    # after another: in the imports, the model, the journal's opening, the
    # runs' resumption, serving. Each stop is clean, and none loses a run.
    counts = str(tmp_path / "executions.txt")
    env = {"REPLAN_TEST_COUNT_FILE": counts, "REPLAN_TEST_EXECUTE_S": "0.3"}
    data = tmp_path / "data"
    # The crash comes while attempts are under way, never as one returns:
    # an answer the kill took before it was journaled is asked for again,
    # as it must be, and would count as a completed task run again. (The
    # 20 submissions alone can outlast an attempt on a busy machine.)
    crashing = {**env, "REPLAN_TEST_EXECUTE_S": "60"}
    first = DaemonProcess(data, *COUNTING, env=crashing).start()
    try:
        with first.client() as client:
            run_ids = [submit(client, gate_policy={"gate_on": []}) for _ in range(20)]
            wait_for(lambda: read_counts(counts)[1], every_s=0.01)
    finally:
        first.kill()
    assert read_counts(counts)[0] == {}, "no attempt returned before the crash"
    for moment_s in (0.0, 0.2, 0.5, 1.0, 1.5, 2.5):
        daemon = DaemonProcess(data, *COUNTING, env=env, console_script=True)
        with pytest.raises(RuntimeError, match="did not get ready"):
            daemon.start(timeout_s=0)
        try:
            wait_for(partial(handles, daemon.pid, signal.SIGHUP), every_s=0.001)
            time.sleep(moment_s)
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGTERM)
            assert daemon.proc.wait(30) == 0, (moment_s, daemon.output())
        finally:
            daemon.close()
        assert "Traceback" not in daemon.output(), moment_s
        assert lock_is_free(data), moment_s
        assert not [p for p in data.iterdir() if p.name.startswith(".api-token")]
    last = DaemonProcess(data, *COUNTING, env=env).start()
    try:
        with last.client() as client:
            views = all_finished(client, run_ids)
    finally:
        assert last.terminate() == 0
    assert {v["status"] for v in views} == {"completed"}
    done, _ = read_counts(counts)
    assert all(n == 1 for n in done.values()), "a completed task ran again"


@needs_proc
@pytest.mark.parametrize(
    ("signum", "code", "line"),
    [
        (signal.SIGTERM, 143, "replan: terminated"),
        (signal.SIGINT, 130, "replan: interrupted"),
    ],
    ids=["TERM", "INT"],
)
def test_a_signal_while_a_client_command_imports_the_package_ends_it_in_one_line(
    tmp_path: Path, signum: signal.Signals, code: int, line: str, refused_port: int
) -> None:
    # As the command ends on the signal once it runs: one line, no
    # traceback (a KeyboardInterrupt's), no death by the signal.
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    replan = Path(sys.executable).with_name("replan")
    proc = subprocess.Popen(
        [str(replan), "runs", "--url", f"http://127.0.0.1:{refused_port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # SIGTERM's is the last handler the command installs.
        wait_for(lambda: handles(proc.pid, signal.SIGTERM), every_s=0.001)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == code, err
    assert not re.search(r"\|\s+replan\.cli$", err, re.MULTILINE)
    assert err.splitlines()[-1] == line
    assert "Traceback" not in err


def test_sighup_drains_the_work_in_flight_as_sigterm_does(tmp_path: Path) -> None:
    # A terminal that closes, or a service manager's reload, sends SIGHUP:
    # it killed the daemon at once (exit 129), and the attempts in flight
    # ran again after the restart.
    counts = str(tmp_path / "executions.txt")
    env = {"REPLAN_TEST_COUNT_FILE": counts, "REPLAN_TEST_EXECUTE_S": "0.5"}
    daemon = DaemonProcess(tmp_path / "data", *COUNTING, env=env).start()
    try:
        with daemon.client() as client:
            for _ in range(3):
                submit(client, gate_policy={"gate_on": []})
            wait_for(lambda: read_counts(counts)[1], every_s=0.01)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        assert daemon.proc.wait(30) == 0, daemon.output()
    finally:
        daemon.close()
    done, cut_short = read_counts(counts)
    assert cut_short == {}, "the drain lets attempts in flight finish"
    assert done
    assert "Traceback" not in daemon.output()


def test_a_second_signal_while_serving_stops_at_once_without_a_traceback(
    tmp_path: Path,
) -> None:
    # uvicorn skips the app's lifespan shutdown on a forced stop; the event
    # loop cancelled the lifespan's task as it closed, and uvicorn logged
    # that as an error with a traceback.
    daemon = DaemonProcess(tmp_path / "data").start()
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(20) == 0, daemon.output()
    finally:
        daemon.close()
    assert "Traceback" not in daemon.output()
    assert "ERROR" not in daemon.output()


@pytest.mark.parametrize("console_script", [True, False], ids=["replan", "python-m"])
def test_signals_after_the_drain_never_kill_the_stopped_daemon(
    tmp_path: Path, console_script: bool
) -> None:
    # The interpreter's exit puts the default handlers back before it tears
    # the modules down: a SIGTERM then killed a daemon that had drained.
    daemon = DaemonProcess(
        tmp_path / "data", "--log-level", "info", console_script=console_script
    ).start()
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "drained;" in daemon.output(), every_s=0.005)
        while daemon.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                daemon.proc.send_signal(signal.SIGTERM)
            time.sleep(0.005)
        assert daemon.proc.wait() == 0, daemon.output()
    finally:
        daemon.close()
    assert "Traceback" not in daemon.output()


def test_an_ignored_sighup_is_left_ignored(tmp_path: Path) -> None:
    # `nohup replan serve &` asks the daemon to outlive its terminal.
    daemon = DaemonProcess(
        tmp_path / "data", console_script=True, ignore_sighup=True
    ).start()
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        with daemon.client() as client:
            assert client.get("/readyz").status_code == 200
        assert daemon.terminate() == 0
    finally:
        daemon.close()
