"""The API's bearer token: configured, or generated once into the data directory."""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigurationError
from ._settings import DaemonSettings

TOKEN_FILE = "api-token"


@dataclass(frozen=True, slots=True)
class Token:
    """The token the API accepts, and whether this start generated it."""

    value: str
    generated_into: Path | None = None

    def matches(self, presented: str) -> bool:
        """Compare in constant time (no early exit on the first wrong byte)."""
        return hmac.compare_digest(presented.encode(), self.value.encode())


_HEADER_CHARACTERS = (
    "use printable ASCII characters only, without spaces: clients send the "
    "token in an HTTP header, which cannot carry others the same way"
)


def _carried_by_a_header(value: str) -> bool:
    return all("!" <= character <= "~" for character in value)


def resolve_token(settings: DaemonSettings) -> Token:
    """The configured token, else the data directory's, else a new one.

    A new token is written with mode 0600 and reported once (``generated_into``).

    Raises:
        ConfigurationError: a non-loopback address without a configured
            token, or an unusable token file.
    """
    if settings.api_token is not None:
        value = settings.api_token.get_secret_value()
        if len(value) < 16:
            raise ConfigurationError("api_token", "use at least 16 characters")
        if not _carried_by_a_header(value):
            raise ConfigurationError("api_token", _HEADER_CHARACTERS)
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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_text().strip()
        if not value:
            raise ConfigurationError("data_dir", f"{path} is empty") from None
        if not _carried_by_a_header(value):
            raise ConfigurationError(
                "data_dir", f"{path}: {_HEADER_CHARACTERS}"
            ) from None
        return Token(value)
    value = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as file:
        file.write(value + "\n")
    return Token(value, generated_into=path)
