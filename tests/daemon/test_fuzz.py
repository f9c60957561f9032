"""Fuzz the running daemon from its own OpenAPI schema: nothing answers 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from daemon_process import TOKEN, DaemonProcess
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error


@pytest.fixture(scope="module")
def fuzzed_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    data: Path = tmp_path_factory.mktemp("fuzz") / "data"
    process = DaemonProcess(data).start()
    try:
        yield process
    finally:
        process.close()


def operations() -> list[str]:
    """The API's operations, as the daemon's schema lists them (at collection
    the daemon is not running: the app builds the same schema offline)."""
    return [
        f"{method.upper()} {path}"
        for path, item in _offline_schema()["paths"].items()
        for method in item
    ]


def _offline_schema() -> dict[str, Any]:
    from replan.daemon import DaemonSettings, Token, create_app
    from replan.daemon._service import Daemon

    settings = DaemonSettings()
    app = create_app(Daemon(settings=settings, token=Token(TOKEN), model=None))  # type: ignore[arg-type]
    return app.openapi()


@pytest.mark.parametrize("operation", operations())
def test_no_request_gets_a_server_error(
    operation: str, fuzzed_daemon: DaemonProcess
) -> None:
    method, path = operation.split(" ", 1)
    api = schemathesis.openapi.from_url(f"{fuzzed_daemon.url}/openapi.json")
    (found,) = [
        result.ok()
        for result in api.get_all_operations()
        if result.ok().method.upper() == method and result.ok().path == path
    ]

    @given(case=found.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        case.call_and_validate(
            base_url=fuzzed_daemon.url,
            headers={"Authorization": f"Bearer {TOKEN}"},
            checks=[not_a_server_error],
            timeout=10,
        )

    check()
