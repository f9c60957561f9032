"""A real HTTP server on 127.0.0.1 that speaks the Chat Completions API.

It runs in a thread (``ThreadingHTTPServer``), so tests on both anyio
backends talk to it with the real ``openai`` client. Answers come from a
script: a queue of :class:`Reply` objects, or a function of the request
body. Every request is logged (``server.requests``) with its JSON body and
headers, so tests can count calls and read what was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from pydantic import BaseModel


@dataclass
class Reply:
    """One scripted HTTP answer."""

    status: int = 200
    body: dict[str, Any] | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: Literal["unanswered", "mid_body"] | None = None
    """Close the connection instead of answering in full: before a byte of
    the answer, or after its head and half its body."""


@dataclass
class Logged:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    method: str = "POST"

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def text(self) -> str:
        """Every message's content, joined: what the model was shown."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


Script = Callable[[Logged], Reply]


def completion(
    content: str | BaseModel | dict[str, Any] | None = None,
    *,
    tool_calls: list[tuple[str, str, dict[str, Any] | str]] | None = None,
    usage: tuple[int, int, int] = (100, 20, 0),
    finish_reason: str | None = None,
    refusal: str | None = None,
    model: str = "test-model",
) -> Reply:
    """A 200 answer. ``content`` may be a model (sent as its JSON);
    ``tool_calls`` are (id, name, arguments); ``usage`` is
    (prompt, completion, cached) tokens."""
    if isinstance(content, BaseModel):
        content = content.model_dump_json()
    elif isinstance(content, dict):
        content = json.dumps(content)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for call_id, name, args in tool_calls
        ]
    prompt, output, cached = usage
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason
                    or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "total_tokens": prompt + output,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )


def error(status: int, message: str = "error", **headers: str) -> Reply:
    """An OpenAI-style error answer (``retry_after="2"`` adds Retry-After)."""
    return Reply(
        status=status,
        body={"error": {"message": message, "type": "test_error", "code": None}},
        headers={k.replace("_", "-"): v for k, v in headers.items()},
    )


class ChatServer:
    """The server and its script; use :func:`chat_server` to run one."""

    def __init__(self) -> None:
        self.requests: list[Logged] = []
        self.queue: deque[Reply] = deque()
        self.script: Script | None = None
        self.page: Reply | None = None
        """The answer to a GET (a page a redirect leads to), else a 405."""
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.httpd.daemon_threads = True

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def reply(self, *replies: Reply) -> None:
        """Queue answers, used in order before the script function."""
        with self.lock:
            self.queue.extend(replies)

    def chat_requests(self) -> list[Logged]:
        with self.lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _answer(self, logged: Logged) -> Reply:
        with self.lock:
            self.requests.append(logged)
            if self.queue:
                return self.queue.popleft()
        if self.script is not None:
            return self.script(logged)
        return error(500, "the test script has no answer for this request")


def _handler_for(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            # As a Chat Completions server answers a GET: a POST that a 301,
            # 302 or 303 made one, say (or the page set as ``page``). Logged.
            headers = {k.lower(): v for k, v in self.headers.items()}
            with server.lock:
                server.requests.append(Logged(self.path, headers, {}, "GET"))
            page = server.page or Reply(405, {"detail": "Method Not Allowed"})
            body = page.body if isinstance(page.body, str) else json.dumps(page.body)
            data = body.encode()
            self.send_response(page.status)
            kind = page.headers.get("content-type", "application/json")
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            headers = {k.lower(): v for k, v in self.headers.items()}
            logged = Logged(self.path, headers, json.loads(raw or b"{}"))
            try:
                reply = server._answer(logged)
            except Exception as exc:  # a broken script must still answer
                reply = error(500, f"script error: {type(exc).__name__}: {exc}")
            if reply.delay_s and server.closing.wait(reply.delay_s):
                return
            if reply.drop == "unanswered":
                self.close_connection = True
                return
            body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            data = body.encode()
            sent = data
            if reply.drop == "mid_body":
                self.close_connection = True
                sent = data[: len(data) // 2]
            try:
                self.send_response(reply.status)
                kind = reply.headers.get("content-type", "application/json")
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    if name != "content-type":
                        self.send_header(name, value)
                self.end_headers()
                self.wfile.write(sent)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

    return Handler


@contextmanager
def chat_server(script: Script | None = None) -> Iterator[ChatServer]:
    """Run a :class:`ChatServer` for the duration of the block."""
    server = ChatServer()
    server.script = script
    thread = threading.Thread(
        target=server.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.httpd.shutdown()
        server.httpd.server_close()
        thread.join(timeout=5)


def answer_type(logged: Logged) -> str:
    """The output type a request asks for (the json_schema name, or the
    ``a <Name>`` of the prompt's output instruction)."""
    fmt = logged.body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return str(fmt["json_schema"]["name"])
    import re

    found = re.search(r"Reply with one JSON object, a (\w+),", logged.text)
    return found.group(1) if found else ""
