"""The model the daemon's runs use, built from the ``model`` setting."""

from __future__ import annotations

import inspect

from .._demo import demo_model
from .._errors import ConfigurationError
from .._importing import import_named
from ..llm import Model, OpenAIModel, Tool
from ..llm._tools import import_tools
from ._settings import DaemonSettings


def build_model(settings: DaemonSettings) -> Model:
    """The model named by ``settings.model``.

    * ``scripted:demo``: the offline demo's scripted model (no key needed);
    * ``python:package.module:name``: ``name`` is a Model, or a function
      of the settings that returns one (custom or test models);
    * ``openai:<model name>``: the OpenAI-compatible adapter.

    Raises:
        ConfigurationError: the setting names no model this build can make.
    """
    kind, _, rest = settings.model.partition(":")
    match kind:
        case "scripted":
            if rest != "demo":
                raise ConfigurationError(
                    "model", f"unknown scripted model {rest!r}; use scripted:demo"
                )
            # Serving for good: the requests are not kept (see keep_calls).
            return demo_model(settings.model_latency_s, keep_calls=0)
        case "python":
            return _imported(rest, settings)
        case "openai":
            if settings.model_latency_s:
                # Else taken and ignored: the endpoint answers at its own pace.
                raise ConfigurationError(
                    "model_latency_s",
                    f"a simulated latency is for scripted models; {settings.model!r} "
                    "answers at its endpoint's own pace",
                )
            if not rest.strip():
                # Else the adapter's own advice: REPLAN_MODEL, which the
                # user may not have set.
                raise ConfigurationError(
                    "model",
                    f"{settings.model!r} names no model: use openai:<model name>",
                )
            # Key and endpoint from OPENAI_API_KEY / OPENAI_BASE_URL.
            try:
                return OpenAIModel(
                    rest,
                    provider_name=settings.model_provider,
                    max_prompt_chars=settings.model_max_prompt_chars or None,
                )
            except ConfigurationError as exc:
                if exc.field != "api_key":
                    raise
                # The adapter's advice names `replan run --base-url`, an
                # option serve does not have.
                raise ConfigurationError(
                    "api_key",
                    "no API key: set OPENAI_API_KEY, or OPENAI_BASE_URL for a "
                    "local server",
                ) from None
    raise ConfigurationError(
        "model",
        f"unknown model {settings.model!r}; use scripted:demo, "
        "python:<module>:<name> or openai:<name>",
    )


def _imported(path: str, settings: DaemonSettings) -> Model:
    found = import_named(path, "model", "use python:<module>:<name>")
    if isinstance(found, Model):
        return found
    not_a_model = f"{path} is not a model, nor a function of the settings returning one"
    if not callable(found):
        raise ConfigurationError("model", not_a_model)
    try:
        inspect.signature(found).bind(settings)
    except TypeError:
        raise ConfigurationError("model", not_a_model) from None
    except ValueError:
        pass  # no signature to check (some builtins): the call will tell
    try:
        model = found(settings)
    except ConfigurationError:
        raise  # names its own field
    except Exception as exc:
        problem = f"{path}(settings) raised {type(exc).__name__}: {exc}"
        raise ConfigurationError("model", problem) from None
    except SystemExit as exc:  # a factory that exits is still a bad model
        raise ConfigurationError("model", f"{path}(settings) raised {exc!r}") from None
    if not isinstance(model, Model):
        raise ConfigurationError(
            "model", f"{path} returned {type(model).__name__}, not a model"
        )
    return model


def build_tools(settings: DaemonSettings) -> list[Tool]:
    """The executor's tools the ``tools`` setting names (see ``import_tools``).

    Raises:
        ConfigurationError: a path cannot be imported, names no tool, or
            two tools share a name (field ``tools``).
    """
    return import_tools(settings.tools)
