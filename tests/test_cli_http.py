"""The command line's HTTP client against small servers on 127.0.0.1 that
are not (or not quite) a replan daemon, and against no server at all."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from replan._client import Backoff, Client, ClientError
from replan.cli import main


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: tuple[int, str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.first: list[tuple[int, str, bytes]] = []
        """Answers given, one each, before ``answer``."""
        self.seen: list[dict[str, str]] = []
        self.hold_s = 0.0
        """How long an event stream stays open, with a keep-alive at its end."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        self.server.seen.append({"path": self.path, **self.headers})
        first = self.server.first
        status, kind, body = first.pop(0) if first else self.server.answer
        self.send_response(status)
        if status in (301, 307):
            self.send_header("Location", "/elsewhere")
        if status == 503:
            self.send_header("Retry-After", "5")
        self.send_header("Content-Type", kind)
        stream = kind == "text/event-stream" and self.server.hold_s > 0
        if not stream:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if stream:
            self.wfile.flush()
            time.sleep(self.server.hold_s)
            self.wfile.write(b": keep-alive\n\n")
            self.close_connection = True

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[list[_Server]]:
    servers: list[_Server] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _start(servers: list[_Server], status: int, kind: str, body: bytes) -> _Server:
    server = _Server((status, kind, body))
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    servers.append(server)
    return server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_stream_that_ends_before_the_run_is_resumed_until_the_client_gives_up(
    serve: list[_Server],
) -> None:
    # A daemon draining for a restart ends its streams cleanly: that is not
    # the end of the run.
    server = _start(serve, 200, "text/event-stream", b": keep-alive\n\n")
    waited: list[float] = []
    backoff = Backoff(first_s=0.5, max_s=2, total_s=6, sleep=waited.append)

    with (
        Client(server.url, "t" * 20, backoff=backoff) as client,
        pytest.raises(ClientError) as failure,
    ):
        list(client.events("r1", after=7))

    assert str(failure.value) == (
        "the event stream ended before the run did (gave up after 6 s of retries)"
    )
    assert waited == [0.5, 1, 2, 2, 0.5]
    assert len(server.seen) == len(waited) + 1
    assert {seen["Last-Event-ID"] for seen in server.seen} == {"7"}


def test_a_stream_served_a_while_before_it_ends_starts_its_waits_afresh(
    serve: list[_Server],
) -> None:
    # A run waiting for a person sends keep-alives only: each restart of the
    # daemon ended its stream, and the waits went on from the last
    # restart's, so `replan watch` gave up after ten restarts however far
    # apart they were, each one followed by a stream served for hours.
    finished = (
        b'id: 9\nevent: run_finished\ndata: {"kind": "run_finished", '
        b'"seq": 9, "at": "2026-01-01T00:00:00Z", '
        b'"status": "completed"}\n\n'
    )
    server = _start(serve, 200, "text/event-stream", finished)
    server.hold_s = 0.15
    server.first += [(200, "text/event-stream", b": keep-alive\n\n")] * 8
    waited: list[float] = []
    backoff = Backoff(first_s=0.01, max_s=0.1, total_s=0.1, sleep=waited.append)

    with Client(server.url, "t" * 20, backoff=backoff) as client:
        events = list(client.events("r1", after=7))

    assert [event.kind for event in events] == ["run_finished"]
    assert waited == [0.01] * 8


def test_a_refused_connection_is_retried_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waited: list[float] = []
    backoff = Backoff(first_s=0.5, max_s=10, total_s=60, sleep=waited.append)
    url = f"http://127.0.0.1:{_closed_port()}"

    with (
        Client(url, None, backoff=backoff) as client,
        pytest.raises(ClientError, match=rf"^cannot reach {url}: .*refused"),
        caplog.at_level("WARNING", logger="replan"),
    ):
        list(client.events("r1"))

    assert waited == [0.5, 1, 2, 4, 8, 10, 10, 10, 10, 4.5]
    # Said once as the waits begin: `replan watch` at a mistyped port (or a
    # daemon that is down) printed nothing for a minute.
    (record,) = caplog.records
    assert record.getMessage().startswith(f"cannot reach {url}: ")
    assert record.getMessage().endswith("; trying again for up to 60 s")


@pytest.fixture
def frozen() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that takes every connection and never answers: a frozen
    daemon. Yields its URL and the connections it took."""
    taken: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.05)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    taken.append(listener.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", taken
        done.set()
        thread.join()
        for connection in taken:
            connection.close()


def test_a_frozen_daemon_is_given_up_on_after_total_s_on_the_clock(
    frozen: tuple[str, list[socket.socket]],
) -> None:
    # Each try waited out its timeout (30 s for a request, 60 s of a silent
    # stream) and only the waits between them counted toward total_s: a
    # submit or watch said "trying again for up to 60 s" and went on for
    # five to ten minutes. The waits here take no time; the tries take
    # 0.2 s each, so a total_s of 0.5 s leaves room for a few tries, not
    # the 51 that 0.01 s waits add up to.
    url, taken = frozen
    waited: list[float] = []
    backoff = Backoff(first_s=0.01, max_s=0.01, total_s=0.5, sleep=waited.append)

    with (
        Client(url, "t" * 20, 0.2, backoff=backoff, stream_silence_s=0.2) as client,
        pytest.raises(ClientError, match=r"gave up after 0\.5 s of retries"),
    ):
        client.call("POST", "/v1/runs", json={"goal": "g"}, resend="always")
    assert len(waited) <= 4
    assert len(taken) == len(waited) + 1

    waited.clear()
    with (
        Client(url, "t" * 20, 0.2, backoff=backoff, stream_silence_s=0.2) as client,
        pytest.raises(ClientError, match=r"sent nothing for 0\.2 s \(gave up after"),
    ):
        list(client.events("r1"))
    assert len(waited) <= 4


_STARTING = (
    503,
    "application/json",
    b'{"detail": "not serving yet: the daemon is starting", "field": null}',
)


def test_a_submission_is_sent_again_under_one_key_until_it_is_accepted(
    serve: list[_Server], capsys: pytest.CaptureFixture[str]
) -> None:
    accepted = b'{"run_id": "r1", "url": "/v1/runs/r1", "status": "running"}'
    server = _start(serve, 202, "application/json", accepted)
    server.first += [_STARTING, (502, "text/html", b"<html></html>"), _STARTING]
    waited: list[float] = []
    backoff = Backoff(first_s=0.5, max_s=10, total_s=60, sleep=waited.append)

    with Client(server.url, "t" * 20, backoff=backoff) as client:
        assert client.call(
            "POST",
            "/v1/runs",
            json={"goal": "g"},
            headers={"Idempotency-Key": "k"},
            resend="always",
        ) == {"run_id": "r1", "url": "/v1/runs/r1", "status": "running"}

    assert waited == [0.5, 1, 2]
    assert [seen["Idempotency-Key"] for seen in server.seen] == ["k"] * 4


def test_submit_sends_one_key_of_its_own_through_a_daemon_that_starts(
    serve: list[_Server],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    accepted = b'{"run_id": "r1", "url": "/v1/runs/r1", "status": "running"}'
    server = _start(serve, 202, "application/json", accepted)
    server.first += [_STARTING, _STARTING]
    monkeypatch.setattr("replan._client.DEFAULT_BACKOFF", Backoff(sleep=lambda _: None))

    assert main(["submit", "--goal", "g", "--url", server.url]) == 0
    assert main(["submit", "--goal", "g", "--url", server.url]) == 0

    assert capsys.readouterr().out == "r1\nr1\n"
    keys = [seen["Idempotency-Key"] for seen in server.seen]
    assert len(keys) == 4
    assert keys[0] != keys[3]  # a new key for each new run
    assert keys[:3] == [keys[0]] * 3


@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        (["cancel", "r1"], b'{"run_id": "r1", "status": "cancelled"}'),
        (
            ["approve", "r1-g1"],
            b'{"gate_id": "r1-g1", "run_id": "r1", "decision": "approve"}',
        ),
    ],
    ids=["cancel", "approve"],
)
def test_an_answer_or_cancel_waits_through_a_daemon_that_starts_and_no_more(
    argv: list[str],
    answer: bytes,
    serve: list[_Server],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _start(serve, 200, "application/json", answer)
    server.first += [_STARTING, _STARTING]
    monkeypatch.setattr("replan._client.DEFAULT_BACKOFF", Backoff(sleep=lambda _: None))
    monkeypatch.setenv("REPLAN_API_TOKEN", "a-token-of-sixteen-chars")

    assert main([*argv, "--url", server.url]) == 0
    assert len(server.seen) == 3
    # A connection that fails is not sent again: the answer may have been
    # taken, and the second would be told the gate is resolved.
    server.first += [(502, "text/html", b"<html></html>")]
    assert main([*argv, "--url", server.url]) == 1
    assert len(server.seen) == 4
    assert "HTTP 502" in capsys.readouterr().err


def test_a_daemon_that_takes_the_request_and_never_answers_is_named_so() -> None:
    # A frozen daemon: the kernel accepts the connection, nothing answers.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with (
            Client(url, "t" * 20, timeout_s=0.2) as client,
            pytest.raises(ClientError) as failure,
        ):
            client.call("POST", "/v1/runs/r1/cancel")
    assert str(failure.value) == f"{url} took the request but did not answer in 0.2 s"
    assert failure.value.status is None


@pytest.fixture
def silent_after_one_event() -> Iterator[tuple[str, list[bytes]]]:
    """A server that answers a stream with one event (the first time; after
    it, nothing), then says nothing more and keeps the connection open (a
    frozen daemon, a connection a NAT forgot); its URL, and the requests it
    got."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    requests: list[bytes] = []

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            requests.append(conn.recv(65536))
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
            if len(requests) == 1:
                head += (
                    b'id: 1\nevent: run_submitted\ndata: {"kind": "run_submitted", '
                    b'"run_id": "r1", "seq": 1, "at": "2026-01-01T00:00:00Z", '
                    b'"spec": {"goal": "g"}}\n\n'
                )
            conn.sendall(head)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", requests
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
    listener.close()
    for conn in held:
        conn.close()
    thread.join(5)


def test_a_stream_that_goes_silent_is_taken_for_dropped_and_resumed(
    silent_after_one_event: tuple[str, list[bytes]],
) -> None:
    url, requests = silent_after_one_event
    waited: list[float] = []
    backoff = Backoff(first_s=0.1, max_s=0.1, total_s=0.2, sleep=waited.append)
    seen: list[int] = []

    # Silences shorter than total_s: the time the tries take counts too.
    with (
        Client(url, "t" * 20, backoff=backoff, stream_silence_s=0.05) as client,
        pytest.raises(ClientError) as failure,
    ):
        seen.extend(event.seq for event in client.events("r1"))

    assert str(failure.value) == (
        "lost the event stream: the daemon sent nothing for 0.05 s "
        "(gave up after 0.2 s of retries)"
    )
    # Each reconnection resumed after the one event seen.
    assert seen == [1]
    assert waited == [0.1, 0.1]
    assert [b"last-event-id: 1" in r.lower() for r in requests] == [
        False,
        True,
        True,
    ]


@pytest.mark.parametrize(
    ("status", "kind", "body"),
    [
        pytest.param(
            501,
            "text/html",
            b"<!DOCTYPE HTML>\n<html>\n<p>no</p>\n</html>\n",
            id="html",
        ),
        pytest.param(200, "text/html", b"<html>\n</html>\n", id="200-html"),
        pytest.param(404, "application/json", b'{"error": "x"}', id="other-json"),
        pytest.param(
            404, "application/json", b'{"detail": "Not Found"}', id="framework-json"
        ),
        pytest.param(307, "text/plain", b"", id="redirect"),
        # A replan daemon's answer to a path it has no route for, as with
        # --url http://HOST:8470/v1 (which asks for /v1/v1/runs).
        pytest.param(
            404,
            "application/json",
            b'{"detail": "Not Found", "field": null}',
            id="replan-daemon-under-a-path",
        ),
        pytest.param(
            405,
            "application/json",
            b'{"detail": "Method Not Allowed", "field": null}',
            id="replan-daemon-wrong-route",
        ),
    ],
)
@pytest.mark.parametrize(
    "argv",
    [["runs"], ["show", "abc"], ["submit", "--goal", "g"], ["watch", "abc"]],
    ids=" ".join,
)
def test_a_url_that_is_no_replan_daemon_is_one_line_naming_it(
    status: int,
    kind: str,
    body: bytes,
    argv: list[str],
    serve: list[_Server],
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = _start(serve, status, kind, body)

    assert main([*argv, "--url", server.url]) == 1

    err = capsys.readouterr().err
    assert err.startswith(
        f"replan: error: {server.url} does not look like a replan daemon "
        f"(HTTP {status} for /v1/"
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("token", "code"),
    [
        pytest.param("secret-token-0123456789\r\n", 1, id="trailing-newline"),
        pytest.param("  secret-token-0123456789 ", 1, id="spaces"),
        pytest.param("secret-t\u00f6ken-0123456789", 2, id="not-ascii"),
        pytest.param("secret-token\n-0123456789", 2, id="newline-inside"),
    ],
)
def test_the_token_is_stripped_checked_and_never_printed(
    token: str,
    code: int,
    serve: list[_Server],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    problem = b'{"detail": "wrong token", "field": "authorization"}'
    server = _start(serve, 403, "application/json", problem)
    monkeypatch.setenv("REPLAN_API_TOKEN", token)

    assert main(["runs", "--url", server.url]) == code

    err = capsys.readouterr().err
    if code == 1:  # sent, stripped
        assert err == "replan: error: 403: wrong token\n"
        assert server.seen[0]["Authorization"] == "Bearer secret-token-0123456789"
    else:
        assert err == (
            "replan: error: REPLAN_API_TOKEN holds characters not allowed "
            "in an HTTP header\n"
        )
        assert not server.seen
    assert "0123456789" not in err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["runs", "--url", "http://[::1"], id="runs"),
        pytest.param(["watch", "x", "--url", "http://[::1"], id="watch"),
    ],
)
def test_a_malformed_url_is_a_bad_argument(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith("replan: error: 'http://[::1' is not a valid URL")
    assert err.count("\n") == 1


def test_a_url_with_a_user_and_password_is_a_bad_argument(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # HTTP clients send a URL's user:password@ as Basic credentials, in the
    # header the token goes in: the daemon then said "a bearer token is
    # required" to a person who had set REPLAN_API_TOKEN.
    monkeypatch.setenv("REPLAN_API_TOKEN", "secret-token-0123456789")
    assert main(["runs", "--url", "http://ana:hunter2@127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "replan: error: the URL holds a user and password (USER:PASSWORD@), "
        "which the daemon does not take: its token comes from REPLAN_API_TOKEN\n"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999", "the port must be 1 to 65535"),
        ("http://127.0.0.1:0", "the port must be 1 to 65535"),
        ("http:///v1", "it names no host"),
        ("https://", "it names no host"),
        ("http://local host:8470", "it holds a space or a line break"),
        (
            "http://127.0.0.1:8000/?x=1",
            "it holds a query (?...): give the daemon's address only",
        ),
        (
            "http://127.0.0.1:8000?",
            "it holds a query (?...): give the daemon's address only",
        ),
        (
            "http://127.0.0.1:8000/#runs",
            "it holds a fragment (#...): give the daemon's address only",
        ),
        # These raised UnicodeError as the name was looked up: "unexpected
        # UnicodeError", exit 1.
        (
            "http://replan..example:8470",
            "its host is no DNS name (a label empty or over 63 characters)",
        ),
        (
            f"http://{'d' * 64}.example:8470",
            "its host is no DNS name (a label empty or over 63 characters)",
        ),
    ],
)
def test_a_url_that_names_no_daemon_is_a_bad_argument_not_unreachable(
    url: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Sent anyway, these were "cannot reach" (exit 1): a host that is no
    # host said "Name or service not known", and port 99999 was taken for
    # another port and said "Connection refused".
    started = time.monotonic()
    assert main(["runs", "--url", url]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert err == f"replan: error: {url!r} is not a valid URL: {problem}\n"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["watch", "abc", "--url", "ftp://x"], id="watch"),
        pytest.param(["runs", "--url", "localhost:8470"], id="no-scheme"),
    ],
)
def test_a_url_of_another_scheme_is_a_bad_argument_at_once(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # `watch` retried it for a minute as if the connection had dropped.
    started = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "is not an http:// or https:// URL" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["approve", "../runs/RUN/cancel"],
        ["reject", "g1?x=1"],
        ["cancel", "a#b"],
        ["watch", "abc/"],
        ["show", "../../etc"],
    ],
    ids=["dot-dot", "query", "fragment", "slash", "show"],
)
def test_an_id_that_would_reach_another_url_is_a_bad_argument(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # `approve ../runs/RUN/cancel` cancelled the run: httpx folds the `..`.
    # Refused before any request (nothing listens on port 9).
    assert main([*argv, "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert f"{argv[1]!r} is no id" in err
    assert err.endswith("ids hold letters, digits, '-' and '_' only\n")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["submit", "--goal", "caf\udce9"], "--goal"),
        (["approve", "r1-g1", "--by", "\udce9ve"], "--by"),
        (["reject", "r1-g1", "--note", "hors p\udce9rim\udce8tre"], "--note"),
    ],
    ids=["goal", "by", "note"],
)
def test_an_argument_that_is_no_utf8_is_a_bad_argument_naming_its_flag(
    argv: list[str],
    flag: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A shell hands bytes that are no UTF-8 (a Latin-1 terminal) on as lone
    # surrogates, which no JSON body can carry. Nothing listens on port 9.
    monkeypatch.setenv("REPLAN_API_TOKEN", "a-token-of-sixteen-chars")
    assert main([*argv, "--url", "http://127.0.0.1:9"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"replan: error: {flag}: '")
    assert line.endswith("' is no text (a lone UTF-16 surrogate)")


@pytest.mark.parametrize(
    ("argv", "body"),
    [
        (["runs"], b'{"items": []}'),
        (["runs"], b'{"runs": [{"run_id": 7}]}'),
        (["submit", "--goal", "g"], b'{"id": "x"}'),
        (["cancel", "abc"], b"[1, 2]"),
    ],
    ids=["no runs key", "a run without its fields", "no run id", "a list"],
)
def test_json_in_a_shape_no_daemon_gives_is_one_line(
    serve: list[_Server],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    body: bytes,
) -> None:
    server = _start(serve, 200, "application/json", body)
    monkeypatch.setenv("REPLAN_API_TOKEN", "a-token-of-sixteen-chars")

    assert main([*argv, "--url", server.url]) == 1

    err = capsys.readouterr().err
    assert err.startswith(
        "replan: error: the server's answer is not one a replan daemon gives ("
    )
    assert err.count("\n") == 1


def _scripted(answers: list[Exception | int], seen: list[str]) -> httpx.MockTransport:
    """A transport answering each request with the next of ``answers``: an
    exception to raise, or a status (503 with Retry-After, or 200)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        headers = {"Retry-After": "5"} if answer == 503 else {}
        body = {"detail": "not serving: the daemon is shutting down", "field": None}
        return httpx.Response(
            answer, json=body if answer == 503 else {}, headers=headers
        )

    return httpx.MockTransport(handle)


def _client_over(transport: httpx.MockTransport, waited: list[float]) -> Client:
    client = Client(
        "http://replan", "t" * 20, backoff=Backoff(total_s=60, sleep=waited.append)
    )
    client._http = httpx.Client(base_url="http://replan", transport=transport)
    return client


def test_a_read_told_the_daemon_restarts_waits_while_its_port_is_closed() -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    seen: list[str] = []
    waited: list[float] = []
    with _client_over(_scripted([503, refused, refused, 200], seen), waited) as c:
        assert c.call("GET", "/v1/gates") == {}
    assert waited == [0.5, 1, 2]
    # Not told so, a refused connection is the answer (a wrong --url).
    with (
        _client_over(_scripted([refused], seen), waited) as c,
        pytest.raises(ClientError, match=r"^cannot reach http://replan: "),
    ):
        c.call("GET", "/v1/gates")


def test_an_answer_that_may_have_been_taken_is_not_sent_again() -> None:
    lost = httpx.ReadTimeout("timed out")
    seen: list[str] = []
    waited: list[float] = []
    with (
        _client_over(_scripted([503, lost], seen), waited) as c,
        pytest.raises(ClientError, match="took the request but did not answer"),
    ):
        c.call("POST", "/v1/gates/r1-g1", json={}, resend="unavailable")
    assert seen == ["POST", "POST"]


def test_a_submission_that_never_gets_through_says_it_was_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    seen: list[str] = []
    waited: list[float] = []
    with (
        _client_over(_scripted([refused] * 20, seen), waited) as c,
        pytest.raises(ClientError) as failure,
        caplog.at_level("WARNING", logger="replan"),
    ):
        c.call("POST", "/v1/runs", json={}, resend="always")
    assert str(failure.value) == (
        "cannot reach http://replan: [Errno 111] Connection refused "
        "(gave up after 60 s of retries)"
    )
    assert sum(waited) == 60
    assert [r.getMessage() for r in caplog.records] == [
        "cannot reach http://replan: [Errno 111] Connection refused; "
        "trying again for up to 60 s"
    ]


def test_submit_sends_the_key_it_is_given_and_refuses_one_no_header_can_be(
    serve: list[_Server],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    accepted = b'{"run_id": "r1", "url": "/v1/runs/r1", "status": "running"}'
    server = _start(serve, 200, "application/json", accepted)
    monkeypatch.setenv("REPLAN_API_TOKEN", "a-token-of-sixteen-chars")
    argv = ["submit", "--goal", "g", "--url", server.url, "--idempotency-key"]

    assert main([*argv, " nightly-2026-11-27 "]) == 0
    assert main([*argv, "caf\u00e9"]) == 2

    assert [seen["Idempotency-Key"] for seen in server.seen] == ["nightly-2026-11-27"]
    assert capsys.readouterr().err == (
        "replan: error: --idempotency-key: 1 to 255 printable ASCII characters "
        "expected\n"
    )
