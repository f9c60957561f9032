"""Base URLs: checked before any call, and shown without credentials."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from .._errors import ConfigurationError

_AUTHORITY = re.compile(r"((?:[A-Za-z][A-Za-z0-9+.-]*:)?/*)([^/?#]*)")
"""A URL's scheme and slashes, then its ``user:password@host:port``: loose
enough to find the credentials of a URL that is not valid."""


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part, even when it is no valid URL."""
    found = _AUTHORITY.match(url)
    assert found is not None  # the pattern matches any string
    at = found.group(2).rfind("@")
    if at < 0:
        return url
    return found.group(1) + url[found.start(2) + at + 1 :]


def check_base_url(url: str, source: str) -> None:
    """Raise :class:`ConfigurationError` unless ``url`` is an http(s) URL
    with a host, and a port from 1 to 65535 if it names one (the client
    takes some bad URLs and fails every call with an obscure error)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        if "out of range" in str(exc):
            problem = url_problem(url, "the port must be 1 to 65535", source)
        else:
            problem = url_problem(url, str(exc), source, foreign=True)
        raise ConfigurationError("base_url", problem) from None
    problem = ""
    if any(c.isspace() for c in url):
        # The client would send it percent-encoded, to a path that is none.
        problem = "it holds a space or a line break"
    elif parts.scheme.lower() not in ("http", "https"):
        problem = "it must start with http:// or https://"
    elif not parts.hostname:
        problem = "it names no host"
    elif port == 0:
        problem = "the port must be 1 to 65535"
    if problem:
        raise ConfigurationError("base_url", url_problem(url, problem, source))


def url_problem(url: str, problem: str, source: str, *, foreign: bool = False) -> str:
    """Why ``url`` is refused, in a message that shows no password, not even
    one the URL's own mistakes (a ``/`` in it) put elsewhere: in a
    ``foreign`` problem (an exception's text), say."""
    found = _AUTHORITY.match(url)
    assert found is not None
    start, end = found.start(2), len(url)
    for mark in "?#":
        if url.find(mark, start) >= 0:
            end = min(end, url.find(mark, start))
    at = url.rfind("@", start, end)
    shown = url
    if at >= 0:
        secret = url[start:at]
        shown = url[:start] + url[at + 1 :]
        if foreign:
            quoted = re.findall(r"'([^']*)'", problem)  # "Invalid port: 'x'"
            for text in (*quoted, secret, secret.partition(":")[2]):
                if text and text in secret:
                    problem = problem.replace(text, "***")
    return f"{shown!r}{source} is no usable URL: {problem}"
