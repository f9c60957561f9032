"""The command line's HTTP client of ``replan serve`` (httpx, synchronous).

Every call raises :class:`ClientError` with one line to print: the API's
own problem text for a 4xx, or why the daemon could not be reached. The
bearer token never appears in one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from .messages import Event, RunCompacted, RunFinished, read_event

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)


def segment(value: str) -> str:
    """``value`` as one URL path segment: a ``/`` or ``..`` in an id cannot
    reach another endpoint."""
    return quote(value, safe="")


class ClientError(Exception):
    """A failed API call, as one line."""

    def __init__(self, message: str, status: int | None = None, code: int = 1) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of the API's answer; None when there was none."""
        self.code = code
        """The command's exit status: 2 when the arguments or settings are bad."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """How an event stream is resumed after the connection drops: waits
    from ``first_s`` doubling up to ``max_s``, ``total_s`` in all since the
    last event before giving up. A stream that the daemon served for
    ``max_s`` or longer before it dropped starts the waits afresh.

    ``total_s`` is time on the clock, not only the waits: a try between
    two waits may take the request's timeout (a daemon that took the
    connection and froze), and ten of those would have kept the command
    trying for ten times its ``total_s``."""

    first_s: float = 0.5
    max_s: float = 10.0
    total_s: float = 60.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def delays(self) -> Iterator[float]:
        delay, waited = self.first_s, 0.0
        started = time.monotonic()
        while waited < self.total_s and time.monotonic() - started < self.total_s:
            step = min(delay, self.total_s - waited)
            yield step
            waited += step
            delay = min(delay * 2, self.max_s)


DEFAULT_BACKOFF = Backoff()
"""The backoff of a client given none."""

_RETRIED = (502, 503, 504)
"""Answers of a daemon (or a proxy before it) that is restarting or draining."""

Resend = Literal["never", "unavailable", "always"]
"""When :meth:`Client.call` sends a request again (see there)."""


def _again(resend: Resend, response: httpx.Response) -> bool:
    """Is ``response`` one to send the request again after?"""
    if resend == "never":
        return False
    status = response.status_code
    if status == 503 and "retry-after" in response.headers:
        return True
    return resend == "always" and status in (502, 504)


STREAM_SILENCE_S = 60.0
"""How long an event stream may stay silent before it counts as dropped: a
live daemon sends an event or a keep-alive at least every ``heartbeat_s``
(15 s by default, 30 s at most), so a longer silence is a connection that
died without closing (a frozen daemon, a NAT or proxy that forgot it)."""


def _url_problem(url: str, parsed: httpx.URL) -> str:
    """What makes ``url`` (parsed as ``parsed``) name no daemon, or ''."""
    if any(c.isspace() for c in url):
        return "it holds a space or a line break"
    if not parsed.host:
        return "it names no host"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return "the port must be 1 to 65535"
    try:
        parsed.raw_host.decode("ascii").encode("idna")
    except UnicodeError:
        # Else found as the name is looked up: "unexpected UnicodeError".
        return "its host is no DNS name (a label empty or over 63 characters)"
    # The API's paths would be appended to the query ("HTTP 404 for /"),
    # or the fragment sent in no request: the daemon's address only.
    if "?" in url:
        return "it holds a query (?...): give the daemon's address only"
    if "#" in url:
        return "it holds a fragment (#...): give the daemon's address only"
    return ""


class Client:
    """The daemon at ``url``, with the bearer token ``token``."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout_s: float = 30,
        *,
        backoff: Backoff | None = None,
        stream_silence_s: float = STREAM_SILENCE_S,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise ClientError(
                "the client needs httpx: pip install 'replan[daemon]'"
            ) from None
        token = (token or "").strip()
        if not (token.isascii() and token.isprintable()):
            raise ClientError(
                "REPLAN_API_TOKEN holds characters not allowed in an HTTP header",
                code=2,
            )
        self._token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(
                base_url=url.rstrip("/"), headers=headers, timeout=timeout_s
            )
        except httpx.InvalidURL as exc:
            raise ClientError(f"{url!r} is not a valid URL: {exc}", code=2) from None
        if self._http.base_url.scheme not in ("http", "https"):
            self._http.close()
            raise ClientError(f"{url!r} is not an http:// or https:// URL", code=2)
        if self._http.base_url.userinfo:
            # httpx would send it as Basic credentials, in place of the token.
            self._http.close()
            raise ClientError(
                "the URL holds a user and password (USER:PASSWORD@), which the "
                "daemon does not take: its token comes from REPLAN_API_TOKEN",
                code=2,
            )
        problem = _url_problem(url, self._http.base_url)
        if problem:
            # Else sent anyway: "cannot reach", or a port taken modulo 65536.
            self._http.close()
            raise ClientError(f"{url!r} is not a valid URL: {problem}", code=2)
        self.url = url
        self.backoff = backoff or DEFAULT_BACKOFF
        self._timeout_s = timeout_s
        self._silence_s = stream_silence_s
        self._stream_timeout = httpx.Timeout(timeout_s, read=stream_silence_s)

    @classmethod
    def from_env(cls, url: str | None) -> Client:
        found = url or os.environ.get("REPLAN_URL")
        if not found:
            raise ClientError("give --url URL or set REPLAN_URL", code=2)
        return cls(found, os.environ.get("REPLAN_API_TOKEN"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self, method: str, path: str, *, resend: Resend | None = None, **kwargs: Any
    ) -> Any:
        """One request; the JSON answer, or ClientError.

        ``resend`` says when the request is sent again, waiting as
        :attr:`backoff` says: ``"unavailable"`` (a read's default) on a 503
        with ``Retry-After`` (the daemon is starting, resuming its journal's
        runs, or draining for a restart), and then while the connection is
        refused (the restart); ``"always"`` (a submission with an
        idempotency key) also when the connection fails or no answer comes,
        and on a proxy's 502 or 504; ``"never"`` (a write's default): a
        submission refused because the journal failed may have been
        journaled all the same (its 503 names the run to look up).
        """
        import httpx

        if resend is None:
            resend = "unavailable" if method == "GET" else "never"
        waits = self.backoff.delays()
        failure: ClientError | None
        # Once a 503 with Retry-After came, a refused connection is the
        # daemon restarting: nothing was sent, so waiting for it is safe.
        restarting = False
        told = False
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.InvalidURL as exc:
                raise ClientError(
                    f"not a valid URL: {self._scrub(exc)}", code=2
                ) from None
            except httpx.ReadTimeout:
                # Reached, and busy or frozen: not "cannot reach".
                failure = ClientError(
                    f"{self.url} took the request but did not answer "
                    f"in {self._timeout_s:g} s"
                )
                unsent = False
            except httpx.HTTPError as exc:
                failure = ClientError(f"cannot reach {self.url}: {self._scrub(exc)}")
                unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            else:
                if not _again(resend, response):
                    break
                failure, restarting = None, True
            if failure is not None and not (
                resend == "always"
                or (resend == "unavailable" and restarting and unsent)
            ):
                raise failure
            delay = next(waits, None)
            if delay is not None and not told:
                told = True
                self._tell_waiting(
                    str(failure) if failure is not None else "the daemon is unavailable"
                )
            if delay is None:
                if failure is not None:
                    raise ClientError(
                        f"{failure} (gave up after {self.backoff.total_s:g} s "
                        "of retries)",
                        failure.status,
                        failure.code,
                    )
                break  # its 503, saying why
            self.backoff.sleep(delay)
        self._checked(response)
        try:
            return response.json()
        except ValueError:
            raise self._not_replan(response) from None

    def events(
        self, run_id: str, after: int = 0, until: int | None = None
    ) -> Iterator[Event]:
        """The run's events after ``after``, up to its ``run_finished`` (or
        ``run_compacted``) event, or to ``until`` if given.

        A dropped connection, a refused one, one silent for longer than
        ``stream_silence_s`` (no event, no keep-alive), or a stream that ends
        before the run (a daemon draining for a restart) is resumed from the
        last event seen (``Last-Event-ID``), waiting as :attr:`backoff` says;
        a ClientError once it gives up.
        """
        import httpx

        last = after
        if until is not None and last >= until:
            return
        waits = self.backoff.delays()
        told = False
        streamed = False  # a stream was opened: a refusal now is a restart
        while True:
            headers = {"Last-Event-ID": str(last)}
            # When the stream opened, and when it last sent a line (an
            # event, a keep-alive).
            opened: float | None = None
            heard = [0.0]
            try:
                with self._http.stream(
                    "GET",
                    f"/v1/runs/{segment(run_id)}/events",
                    headers=headers,
                    timeout=self._stream_timeout,
                ) as response:
                    self._checked(response)
                    kind = response.headers.get("content-type", "")
                    if not kind.startswith("text/event-stream"):
                        raise self._not_replan(response)
                    opened = heard[0] = time.monotonic()
                    streamed = True
                    for event in _parse(_heard(response.iter_lines(), heard)):
                        last = event.seq
                        waits, told = self.backoff.delays(), False
                        yield event
                        if isinstance(event, RunFinished | RunCompacted):
                            return
                        if until is not None and last >= until:
                            return
                problem = "the event stream ended before the run did"
            except httpx.ReadTimeout:
                problem = (
                    "lost the event stream: the daemon sent nothing "
                    f"for {self._silence_s:g} s"
                )
            except (httpx.TransportError, httpx.DecodingError) as exc:
                problem = (
                    f"lost the event stream: {self._scrub(exc)}"
                    if streamed or not isinstance(exc, httpx.ConnectError)
                    else f"cannot reach {self.url}: {self._scrub(exc)}"
                )
            except ClientError as exc:
                if exc.status not in _RETRIED:
                    raise
                problem = f"lost the event stream: {exc}"
            if opened is not None and heard[0] - opened >= self.backoff.max_s:
                # The daemon served the stream a while (a run that waits
                # for a person sends keep-alives only): this is a new drop
                # (another restart), not the last one going on, so its
                # waits start afresh.
                waits, told = self.backoff.delays(), False
            delay = next(waits, None)
            if delay is None:
                raise ClientError(
                    f"{problem} (gave up after {self.backoff.total_s:g} s of retries)"
                )
            if not told:
                told = True
                self._tell_waiting(problem)
            self.backoff.sleep(delay)

    def _tell_waiting(self, problem: str) -> None:
        """Say once, as the waits begin, why the command is waiting and
        for how long at most: else a mistyped port or a daemon that is down
        looked like a command that hangs."""
        logger.warning("%s; trying again for up to %g s", problem, self.backoff.total_s)

    def _checked(self, response: httpx.Response) -> None:
        """ClientError unless ``response`` is a replan daemon's 2xx."""
        if response.status_code < 300:
            return
        response.read()
        try:
            body = response.json()
            # A replan daemon's problem: both keys, whatever the status (a
            # web framework's own 404 has a detail only).
            detail, field = body["detail"], body["field"]
        except (ValueError, KeyError, TypeError):
            raise self._not_replan(response) from None
        if response.status_code in (404, 405) and field is None:
            # The daemon has no such route (every run or gate it does not
            # know is named by its field): the URL holds a path of its own,
            # such as ``http://HOST:8470/v1``.
            raise self._not_replan(response)
        text = self._scrub(detail if isinstance(detail, str) else str(detail))
        if response.status_code == 401 and not self._token:
            # The daemon wants the token its start printed: name where it goes.
            raise ClientError(
                f"401: {text}: set REPLAN_API_TOKEN to the daemon's token", 401, 2
            )
        # Input the daemon refused, naming its field (a spec, a gate's
        # answer): a bad argument, exit 2, as one the command refuses itself.
        bad_input = response.status_code in (400, 413, 422) and field is not None
        raise ClientError(
            f"{response.status_code}: {text}",
            response.status_code,
            2 if bad_input else 1,
        )

    def _not_replan(self, response: httpx.Response) -> ClientError:
        return ClientError(
            f"{self.url} does not look like a replan daemon "
            f"(HTTP {response.status_code} for {response.request.url.path})",
            response.status_code,
        )

    def _scrub(self, text: object) -> str:
        """``text`` without the token (an error may quote the request)."""
        found = str(text)
        return found.replace(self._token, "***") if self._token else found


def _heard(lines: Iterator[str], heard: list[float]) -> Iterator[str]:
    """``lines``, keeping in ``heard[0]`` when the last one came."""
    for line in lines:
        heard[0] = time.monotonic()
        yield line


def _parse(lines: Iterator[str]) -> Iterator[Event]:
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield read_event("\n".join(data))
                data = []
        elif line.startswith("data: "):
            data.append(line.removeprefix("data: "))
