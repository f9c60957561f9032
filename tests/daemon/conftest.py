from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import DaemonProcess, refusing_port


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon serving the demo's scripted model, with a known token."""
    process = DaemonProcess(tmp_path / "data").start()
    try:
        yield process
    finally:
        process.close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port nothing listens on (connections are refused) for the test."""
    with refusing_port() as port:
        yield port
