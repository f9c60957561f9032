"""The command line's HTTP client of ``replan serve`` (httpx, synchronous).

Every call raises :class:`ClientError` with one line to print: the API's
own problem text for a 4xx, or why the daemon could not be reached.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .messages import EVENT_ADAPTER, Event

if TYPE_CHECKING:
    import httpx


class ClientError(Exception):
    """A failed API call, as one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of the API's answer; None when there was none."""


class Client:
    """The daemon at ``url``, with the bearer token ``token``."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30) -> None:
        try:
            import httpx
        except ImportError:
            raise ClientError(
                "the client needs httpx: pip install 'replan[daemon]'"
            ) from None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s
        )
        self.url = url

    @classmethod
    def from_env(cls, url: str | None) -> Client:
        found = url or os.environ.get("REPLAN_URL")
        if not found:
            raise ClientError("give --url URL or set REPLAN_URL")
        return cls(found, os.environ.get("REPLAN_API_TOKEN"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; the JSON answer, or ClientError."""
        import httpx

        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach {self.url}: {exc}") from None
        return _checked(response).json()

    def events(
        self, run_id: str, after: int = 0, until: int | None = None
    ) -> Iterator[Event]:
        """The run's events after ``after``; reconnects (``Last-Event-ID``)
        when the connection drops, and stops after ``until`` if given."""
        import httpx

        last = after
        retries = 0
        while True:
            headers = {"Last-Event-ID": str(last)}
            try:
                with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
                ) as response:
                    _checked(response)
                    for event in _parse(response.iter_lines()):
                        last = event.seq
                        retries = 0
                        yield event
                        if until is not None and last >= until:
                            return
                    return
            except (httpx.TransportError, httpx.DecodingError) as exc:
                retries += 1
                if retries > 5:
                    raise ClientError(f"lost the event stream: {exc}") from None


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    response.read()
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    raise ClientError(f"{response.status_code}: {detail}", response.status_code)


def _parse(lines: Iterator[str]) -> Iterator[Event]:
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield EVENT_ADAPTER.validate_json("\n".join(data))
                data = []
        elif line.startswith("data: "):
            data.append(line.removeprefix("data: "))
