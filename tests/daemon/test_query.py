"""Query parameters no endpoint takes are dropped before anything sees them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from daemon_process import DaemonProcess

from replan._demo import demo_model
from replan.daemon import DaemonSettings, Token, create_app
from replan.daemon._app import QUERY_PARAMETERS
from replan.daemon._limits import KnownQuery
from replan.daemon._server import uvicorn_server
from replan.daemon._service import Daemon


def test_the_known_parameters_are_every_query_parameter_of_the_api(
    tmp_path: Path,
) -> None:
    daemon = Daemon(
        settings=DaemonSettings(data_dir=tmp_path),
        token=Token("query-test-token-0123"),
        model=demo_model(),
    )
    schema = create_app(daemon).openapi()
    taken = {
        parameter["name"]
        for path in schema["paths"].values()
        for operation in path.values()
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query"
    }
    assert taken == QUERY_PARAMETERS
    # The served app is the API behind the filter.
    app = uvicorn_server(daemon).config.app
    assert isinstance(app, KnownQuery)
    assert app.names == QUERY_PARAMETERS


async def test_unknown_parameters_are_dropped_and_known_ones_kept_byte_for_byte() -> (
    None
):
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["query_string"])

    known = KnownQuery(app, {"limit", "status", "run_id"})
    for query in (
        b"limit=5&access_token=SECRET&status=running&status=failed",
        b"api%5Fkey=SECRET&run%5Fid=r%2D1",
        b"limit=5&status=running",
        b"",
    ):
        await known({"type": "http", "query_string": query}, None, None)
    assert seen == [
        b"limit=5&status=running&status=failed",
        b"run%5Fid=r%2D1",
        b"limit=5&status=running",
        b"",
    ]


def test_a_secret_in_the_query_reaches_no_span_nor_the_access_log(
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(
        tmp_path / "data",
        "--log-level",
        "info",
        env={"OTEL_TRACES_EXPORTER": "console"},
    ).start()
    try:
        with daemon.client() as client:
            listed = client.get("/v1/runs?access_token=QUERYSECRET123&limit=5")
            health = client.get("/healthz?api_key=KEYSECRET456")
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert listed.status_code == 200
    assert health.status_code == 200
    output = daemon.output()
    assert "limit=5" in output  # the spans were printed, known parameters kept
    assert "QUERYSECRET123" not in output
    assert "KEYSECRET456" not in output
    # The access log shows each request with the parameters it was handled with.
    assert '"GET /v1/runs?limit=5 HTTP/1.1" 200' in output
    assert '"GET /healthz HTTP/1.1" 200' in output
