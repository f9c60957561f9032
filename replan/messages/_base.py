from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from .._errors import ConfigurationError


class Frozen(BaseModel):
    """Base of every message: immutable, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Settings(Frozen):
    """A frozen model whose construction errors are configuration errors.

    Building one with a bad field raises :class:`ConfigurationError` naming the
    field (``limits.max_replans``), not a bare pydantic ``ValidationError``.
    """

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigurationError.from_validation(exc) from None
