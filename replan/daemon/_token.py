"""The API's bearer token: configured, or generated once into the data directory."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigurationError
from ._settings import DaemonSettings

TOKEN_FILE = "api-token"

logger = logging.getLogger("replan.daemon")


@dataclass(frozen=True, slots=True)
class Token:
    """The token the API accepts, and whether this start generated it."""

    value: str
    generated_into: Path | None = None

    def matches(self, presented: str) -> bool:
        """Compare in constant time (no early exit on the first wrong byte)."""
        return hmac.compare_digest(presented.encode(), self.value.encode())


MIN_LENGTH = 16
"""The shortest token the API accepts."""

_HEADER_CHARACTERS = (
    "use printable ASCII characters only, without spaces: clients send the "
    "token in an HTTP header, which cannot carry others the same way"
)


def _unusable(value: str) -> str | None:
    """What makes ``value`` no token, or None (the rule for a configured
    token and a token file alike)."""
    if len(value) < MIN_LENGTH:
        return f"use at least {MIN_LENGTH} characters"
    if not all("!" <= character <= "~" for character in value):
        return _HEADER_CHARACTERS
    return None


def resolve_token(settings: DaemonSettings) -> Token:
    """The configured token, else the data directory's, else a new one.

    A new token is written with mode 0600 and reported once (``generated_into``).

    Raises:
        ConfigurationError: a non-loopback address without a configured
            token, or an unusable token file.
    """
    if settings.api_token is not None:
        value = settings.api_token.get_secret_value()
        problem = _unusable(value)
        if problem is not None:
            raise ConfigurationError("api_token", problem)
        return Token(value)
    if not settings.loopback:
        raise ConfigurationError(
            "api_token",
            f"refusing to listen on {settings.host} without REPLAN_API_TOKEN set",
        )
    path = settings.data_dir / TOKEN_FILE
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return _read_or_create(path)
    except OSError as exc:
        raise ConfigurationError("data_dir", f"cannot keep the token: {exc}") from None


def _read_or_create(path: Path) -> Token:
    try:
        return _create(path)
    except FileExistsError:
        problem: str | None
        try:
            value = path.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            value, problem = "", _HEADER_CHARACTERS
        else:
            problem = "it is empty" if not value else _unusable(value)
        if problem is not None:
            raise ConfigurationError(
                "data_dir", f"{path}: {problem} (delete it for a new token)"
            ) from None
        _warn_if_shared(path)
        return Token(value)


def _create(path: Path) -> Token:
    """A new token in a new file at ``path``, which appears whole or not at
    all: a start cut short as it wrote (a signal, ``kill -9``, a full disk)
    must not leave an empty file that refuses every later start.

    Raises:
        FileExistsError: ``path`` exists already.
    """
    if path.exists():
        raise FileExistsError(path)
    value = secrets.token_urlsafe(32)
    fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(fd, "w") as file:
            file.write(value + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(draft, path)  # unlike a rename, never replaces a file
        except FileExistsError:
            raise
        except OSError:
            # A file system without hard links: the data directory's lock
            # keeps any other daemon from making the file meanwhile.
            os.replace(draft, path)
            return Token(value, generated_into=path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)
    return Token(value, generated_into=path)


def _warn_if_shared(path: Path) -> None:
    """Say so when others on the machine may read the token file: whoever
    reads it may use the API (and a daemon without a configured token
    listens on loopback, where every local user can reach it)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077:
        logger.warning(
            "%s can be read by other users (mode %04o), and whoever reads it "
            "may use the API: chmod 600 %s",
            path,
            mode,
            path,
        )
