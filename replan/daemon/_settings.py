"""The daemon's settings: flags, then ``REPLAN_*`` variables, then a TOML file."""

from __future__ import annotations

import ipaddress
import json
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .._demo import MAX_LATENCY_S
from .._errors import ConfigurationError
from ..messages import Limits
from ..messages._base import refuse_boolean_number
from ..supervisor._roles import ROLES

MAX_RETENTION_AGE_S = 1_000 * 365 * 86_400.0
"""The oldest a finished run may get before retention: 1000 years, a cutoff
date well after year 1 (the first a date can hold)."""

_config_file: ContextVar[Path | None] = ContextVar("replan_config_file", default=None)


class _GivenTwice(Exception):
    """A JSON object names a key twice (the key is the message)."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's keys, refused when one comes twice: ``json.loads``
    would keep the last silently."""
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise _GivenTwice(key)
        mapping[key] = value
    return mapping


class DaemonSettings(BaseSettings):
    """How ``replan serve`` runs. Every field is also ``REPLAN_<NAME>``.

    Nested fields use ``__`` in variables (``REPLAN_DEFAULT_LIMITS__MAX_REPLANS``)
    and tables in the TOML file (``[default_limits]``).
    """

    model_config = SettingsConfigDict(
        env_prefix="REPLAN_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback needs ``api_token`` set."""
    port: int = Field(default=8470, ge=0, le=65535)
    """0: any free port, the one taken written to ``port_file`` (and logged)."""
    port_file: Path | None = None
    """A file the daemon writes its address into (``http://HOST:PORT`` and a
    newline) once it listens, and removes as it exits: how a program that
    starts it with ``port=0`` learns the port."""
    data_dir: Path = Path("replan-data")
    """Holds the SQLite journal (``journal.db``) and a generated token."""
    journal_dsn: SecretStr | None = None
    """A PostgreSQL connection string: the journal is kept in that database
    (the ``postgres`` extra; see ``PostgresStore``) instead of
    ``data_dir/journal.db``. Daemons on one database, on any machines,
    share the work: each drives the runs it holds the leases of, and takes
    over those of a daemon that died once their leases expire."""
    journal_lease_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    """With ``journal_dsn``: how long a run stays leased to this daemon
    after its last renewal (renewed every third of it), so how soon another
    daemon takes over the runs of one that died (at its next look for runs
    to drive on, see ``redrive_interval_s``)."""
    api_token: SecretStr | None = None
    """The bearer token of the API; generated into ``data_dir`` when unset.
    An empty one (``REPLAN_API_TOKEN=``) is unset."""
    model: str = "scripted:demo"
    """``scripted:demo``, ``python:package.module:factory``, or ``openai:<name>``."""
    model_provider: str = "openai"
    """For ``openai:<name>``: the server behind ``OPENAI_BASE_URL`` as telemetry
    names it (``openai``, ``vllm``, ``ollama``, ``litellm``...)."""
    model_max_prompt_chars: int = Field(default=100_000, ge=0)
    """For ``openai:<name>``: the prompt budget in characters, at least 1000
    (see ``OpenAIModel.max_prompt_chars``); 0 for no bound."""
    model_latency_s: float = Field(default=0.0, ge=0.0, le=MAX_LATENCY_S)
    """Simulated seconds per call, for the scripted models."""
    tools: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """The executor's tools, each ``module:name``: a tool (``@replan.tool``),
    a plain function, or a list of them. A side-effect tool's calls wait at
    a gate answered over ``POST /v1/gates/{id}``. ``REPLAN_TOOLS`` takes
    them separated by commas, or as a JSON list."""
    default_limits: Limits = Field(default_factory=Limits)
    """Limits of runs submitted without their own (fields they set win)."""
    workers: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    """Global concurrency per actor role, e.g. ``{"executor": 64}``; in
    ``REPLAN_WORKERS`` as the flag takes it (``executor=64,planner=2``) or
    as a JSON object."""
    max_body_bytes: int = Field(default=1_048_576, ge=1_024, le=64 * 1_048_576)
    """Largest request body accepted; larger ones get 413."""
    max_active_runs: int = Field(default=1_000, ge=1, le=1_000_000)
    """Runs that may be unfinished at once (running or waiting for a person);
    a submission past it gets 429 and should be retried later."""
    drain_grace_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    """On SIGTERM: how long model calls in flight may take to finish."""
    heartbeat_s: float = Field(default=15.0, ge=0.1, le=30.0)
    """Seconds between keep-alive comments on an idle event stream: at least
    0.1 (each one is a write to every idle stream), at most 30 (``replan
    watch`` takes a minute's silence for a dead connection)."""
    retention: Literal["compact", "delete", "off"] = "compact"
    """What happens to finished runs older than ``retention_age_s``."""
    retention_age_s: float = Field(default=7 * 86_400.0, ge=0.0, le=MAX_RETENTION_AGE_S)
    """At most 1000 years: the cutoff is a date, and dates end at year 1."""
    retention_interval_s: float = Field(default=3_600.0, ge=0.1, le=86_400.0)
    """How often retention looks for old runs: at least 0.1 seconds, at
    most a day."""
    redrive_interval_s: float = Field(default=30.0, ge=0.0, le=86_400.0)
    """How often the daemon looks for unfinished runs it does not drive (a
    journal failure let go of them; with PostgreSQL, also those of a daemon
    that died, once their leases expired) and drives them on: at least 0.1,
    or 0 (or ``off``) not to look. While the journal keeps failing it looks less
    often, down to once per 16 intervals (at most 10 minutes apart)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_boolean_number(cls, value, info)

    @field_validator("api_token", "port_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # As compose files and CI jobs set a variable they leave blank; only
        # the empty text: a token of spaces is a mistake, refused as short.
        return None if value == "" else value

    @field_validator("port_file")
    @classmethod
    def _in_a_directory(cls, path: Path | None) -> Path | None:
        # Found only once the daemon listened and checked its journal: a
        # mistyped directory is refused before anything starts.
        if path is not None and not path.parent.is_dir():
            raise ValueError(f"no directory {path.parent} to write {path.name} in")
        return path

    @field_validator("data_dir", mode="before")
    @classmethod
    def _a_directory(cls, value: Any) -> Any:
        # Path("") is ".": the journal and the token went into the current
        # directory, whatever it was.
        if isinstance(value, str) and not value.strip():
            raise ValueError("name a directory (default ./replan-data)")
        return value

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        # Blank, it was taken for a non-loopback address that needs a token,
        # or else could not be resolved: neither says what is wrong.
        if not host.strip():
            raise ValueError("name an address to listen on (default 127.0.0.1)")
        return host

    @field_validator("redrive_interval_s", mode="before")
    @classmethod
    def _off_is_zero(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "off":
            return 0.0
        return value

    @field_validator("redrive_interval_s")
    @classmethod
    def _not_busy(cls, seconds: float) -> float:
        if 0 < seconds < 0.1:
            raise ValueError("must be at least 0.1 seconds, or 0 (off) not to look")
        return seconds

    @field_validator("model_max_prompt_chars")
    @classmethod
    def _a_usable_budget(cls, chars: int) -> int:
        if 0 < chars < 1_000:
            raise ValueError("must be at least 1000, or 0 for no bound")
        return chars

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_list(cls, tools: Any) -> Any:
        if not isinstance(tools, str):
            return tools
        if tools.lstrip().startswith("["):
            try:
                return json.loads(tools)
            except ValueError as exc:
                raise ValueError(f"not a JSON list: {exc}") from None
        return [t.strip() for t in tools.split(",") if t.strip()]

    @field_validator("workers", mode="before")
    @classmethod
    def _worker_sizes(cls, workers: Any) -> Any:
        if not isinstance(workers, str):
            return workers
        if workers.lstrip().startswith("{"):
            try:
                return json.loads(workers, object_pairs_hook=_once_each)
            except _GivenTwice as exc:
                twice = f"{exc} is given twice ({workers.strip()!r})"
                raise ValueError(twice) from None
            except ValueError as exc:
                raise ValueError(f"not a JSON object: {exc}") from None
        sizes = {}
        for item in filter(None, (i.strip() for i in workers.split(","))):
            role, sep, size = item.partition("=")
            if not sep:
                raise ValueError(
                    f"takes ROLE=N (executor=64,planner=2) or a JSON object, "
                    f"not {item!r}"
                )
            role = role.strip()
            if role in sizes:
                raise ValueError(f"{role} is given twice ({workers.strip()!r})")
            sizes[role] = size.strip()
        return sizes

    @field_validator("workers")
    @classmethod
    def _known_roles(cls, workers: dict[str, int]) -> dict[str, int]:
        for role, size in workers.items():
            if role not in ROLES:
                raise ValueError(
                    f"unknown role {role!r}; use one of {', '.join(ROLES)}"
                )
            if size < 1:
                raise ValueError(f"{role}: must be at least 1")
        return workers

    @property
    def journal_path(self) -> Path:
        return self.data_dir / "journal.db"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _config_file.get()
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if path is not None:
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=path),)
        return sources


def load_settings(
    config_file: str | Path | None = None, **flags: Any
) -> DaemonSettings:
    """Settings from ``flags`` (None means unset), the environment, the file.

    ``config_file`` is ``REPLAN_CONFIG`` when not given, as every setting
    is also a variable (an empty one is none).

    Raises:
        ConfigurationError: a value is invalid (names the field), or the
            file cannot be read.
    """
    given = {name: value for name, value in flags.items() if value is not None}
    if config_file is None:
        config_file = os.environ.get("REPLAN_CONFIG") or None
    if config_file is not None and not str(config_file).strip():
        raise ConfigurationError("config", "name a TOML file, not a blank path")
    path = Path(config_file) if config_file is not None else None
    if path is not None and not path.is_file():
        # A directory or a device is there, but is no file to read settings from.
        problem = "not a file" if path.exists() else "no such file"
        raise ConfigurationError("config", f"{problem}: {path}")
    token = _config_file.set(path)
    try:
        return DaemonSettings(**given)
    except ValidationError as exc:
        raise ConfigurationError.from_validation(exc) from None
    except ValueError as exc:  # a TOML syntax error, a REPLAN_* not parsed
        from_env = path is None or "EnvSettingsSource" in str(exc)
        where = "the REPLAN_* variables" if from_env else path
        raise ConfigurationError("config", f"{where}: {exc}") from None
    finally:
        _config_file.reset(token)
