"""The real daemon in a subprocess on 127.0.0.1, and an httpx client to it."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from replan.messages import EVENT_ADAPTER

TOKEN = "test-token-0123456789abcdef"
HERE = Path(__file__).parent


_port_files = itertools.count()


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound but not listening while the block runs: connections to
    it are refused, and no other program can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _default_sighup() -> None:
    # A test run started under nohup (or by a runner that ignores SIGHUP)
    # hands the ignored signal down to every child, and the daemon rightly
    # leaves an ignored SIGHUP ignored: start it as a terminal starts it.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class DaemonProcess:
    """``replan serve`` as a child process; ``start()`` waits for /readyz."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        env: dict[str, str] | None = None,
        token: str | None = TOKEN,
        console_script: bool = False,
        ignore_sighup: bool = False,
    ) -> None:
        self.data_dir = data_dir
        # The installed ``replan`` command rather than ``python -m replan``.
        self.console_script = console_script
        # As `nohup` starts it.
        self.ignore_sighup = ignore_sighup
        self.args = args
        # The daemon takes any free port and names it in this file: a port
        # found free beforehand could be taken by another program meanwhile.
        self.port_file = data_dir.with_name(
            f".{data_dir.name}-{os.getpid()}-{next(_port_files)}.port"
        )
        self.port = 0
        self.url = ""
        self.token = token
        self.extra_env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.log = data_dir / "daemon.log"

    def start(self, timeout_s: float = 20) -> DaemonProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAN_")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), *filter(None, [env.get("PYTHONPATH")])]
        )
        if self.token is not None:
            env["REPLAN_API_TOKEN"] = self.token
        env.update(self.extra_env)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A daemon killed by the test leaves its file behind.
        self.port_file.unlink(missing_ok=True)
        self.url = ""
        program = (
            [str(Path(sys.executable).with_name("replan"))]
            if self.console_script
            else [sys.executable, "-m", "replan"]
        )
        command = [
            *program,
            "serve",
            "--port",
            # Started again, it keeps its address: clients hold it.
            str(self.port),
            "--port-file",
            str(self.port_file),
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            "warning",
            *self.args,
        ]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=_ignore_sighup if self.ignore_sighup else _default_sighup,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited early:\n{self.output()}")
            if not self.url:
                self._read_port_file()
                time.sleep(0.05)
                continue
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not get ready:\n{self.output()}")

    def _read_port_file(self) -> None:
        try:
            url = self.port_file.read_text().strip()
        except FileNotFoundError:
            return
        self.url = url
        self.port = int(url.rpartition(":")[2])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10, **kwargs)

    def terminate(self, timeout_s: float = 30) -> int:
        """SIGTERM, then wait for the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """kill -9: no chance to drain or journal anything more."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_for(
    predicate: Any, timeout_s: float = 20, every_s: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate()`` until it returns something truthy (``what``: what
    the failure says was waited for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if what:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            raise AssertionError(f"timed out waiting for {predicate}")
        time.sleep(every_s)


def read_events(
    client: httpx.Client, run_id: str, after: int, last: int
) -> list[tuple[int, Any]]:
    """A run's events after ``after`` up to ``last``, with their ids, read
    from its event stream (which goes on while the run lives)."""
    found: list[tuple[int, Any]] = []
    seq = after
    with client.stream(
        "GET", f"/v1/runs/{run_id}/events", params={"after": after}
    ) as response:
        assert response.status_code == 200, response.read()
        if after >= last:
            return found
        for line in response.iter_lines():
            if line.startswith("id: "):
                seq = int(line.removeprefix("id: "))
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                found.append((seq, EVENT_ADAPTER.validate_python(data)))
                if seq >= last:
                    break
    return found


def check_runs_page(
    response: httpx.Response,
    statuses: list[str],
    limit: int,
    ended: dict[str, Any],
) -> None:
    """A ``GET /v1/runs`` answer holds at most ``limit`` runs, each of the
    statuses asked for, an ended one as it ended (``ended``: views by id)."""
    assert response.status_code == 200, response.text
    page = response.json()
    assert len(page["runs"]) <= limit
    for run in page["runs"]:
        if statuses:
            assert run["status"] in statuses
        if run["run_id"] in ended:
            assert run["status"] == ended[run["run_id"]]["status"]
