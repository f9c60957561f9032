"""``replan serve`` under signals, in a real process: whenever SIGTERM,
SIGINT or SIGHUP comes, the daemon stops cleanly (exit 0), never dies by it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from counting_model import read_counts
from daemon_process import DaemonProcess, free_port, wait_for
from test_durability import COUNTING, submit

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
    tmp_path: Path,
) -> None:
    # Nothing listens on the collector's port, so the daemon waits
    # TELEMETRY_FLUSH_S for it after the drain; the event loop had put the
    # default handlers back by then, and the second SIGTERM killed it.
    daemon = DaemonProcess(
        tmp_path / "data",
        "--log-level",
        "info",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
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
