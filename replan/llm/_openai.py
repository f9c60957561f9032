"""The OpenAI adapter: any Chat Completions endpoint (OpenAI, vLLM, Ollama, LiteLLM)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Self, get_args

import anyio
import anyio.lowlevel
import openai
from pydantic import ValidationError

from .._errors import (
    BudgetExhausted,
    ConfigurationError,
    ModelError,
    ModelOutputError,
)
from ..messages import TokenUsage, ToolCall
from ._answers import (
    answer,
    answered_by,
    brief,
    reported_error,
    unparsed_body,
)
from ._budget import FittedPrompt, fit_prompt
from ._numbers import finite_number, whole_number
from ._port import ModelRequest, ModelResponse
from ._pricing import ModelPrice, price_table, priced
from ._prompts import ROLES, PromptRegistry
from ._retry import BackoffPolicy, redirected_as_get, status_error, with_retries
from ._schema import describe_errors, parse_output, response_schema, schema_text
from ._urls import check_base_url, url_problem, without_credentials

StructuredOutput = Literal["auto", "json_schema", "json_object", "prompt"]
"""How the answer's shape is asked for:

* ``json_schema``: the server enforces the schema (OpenAI, vLLM, Ollama,
  LiteLLM to providers that support it); strict where the schema allows.
* ``json_object``: JSON mode; the schema is in the prompt.
* ``prompt``: no ``response_format`` at all; the schema is in the prompt.
* ``auto``: ``json_schema``, falling back to ``json_object`` and then
  ``prompt`` when the server rejects the request with 400; kept per model
  name from then on.

Whatever the mode, the answer is validated with pydantic.
"""

_MODES: tuple[StructuredOutput, ...] = get_args(StructuredOutput)
_FALLBACK: dict[str, StructuredOutput] = {
    "json_schema": "json_object",
    "json_object": "prompt",
}
TEMPERATURE_ROLES = ("executor", "evolver")
"""Roles whose temperature may be set; planner, reviewer and ranker stay at 0."""
SAMPLED_PURPOSES = frozenset({("planner", "hypotheses")})
"""Requests sent at the temperature they carry although their role runs at 0:
an explore run's hypotheses, asked at ``ExploreSettings.temperature`` for
diverse ideas (a plan, a review or a ranking is never sampled)."""
LOCAL_KEY = "not-needed"
MAX_PROMPT_CHARS = 100_000
"""The default prompt budget: about 25,000 tokens at some four characters a
token, which leaves a 32k-token context window room for the output format
and the answer, and is well inside the 128k of hosted models."""
MIN_PROMPT_CHARS = 1_000
"""The smallest budget taken: the shipped roles' instructions alone take 350
to 1,700 characters, so a smaller one is a slip (tokens for characters?),
not a budget any prompt could keep."""
REASK_ECHO_CHARS = 4_000
"""The most characters of an invalid answer shown back to the model when it
is asked again. The validation errors say what to fix; a long answer
(prose instead of JSON, say) shown whole could make the re-ask too long
for the model's context, and the server would refuse it."""

logger = logging.getLogger("replan.llm")


class OpenAIModel:
    """A :class:`~replan.llm.Model` over ``openai.AsyncOpenAI``.

    Args:
        model: the default model name (else ``REPLAN_MODEL``).
        api_key: else ``OPENAI_API_KEY``; a local server (a ``base_url``
            other than OpenAI's) needs none.
        base_url: else ``OPENAI_BASE_URL``, else OpenAI.
        models: model name per role (``{"executor": "gpt-4o-mini"}``); a
            key that names no role is refused, not ignored.
        temperatures: sampling temperature for ``executor`` and ``evolver``;
            the planner, reviewer and ranker run at 0 (but for an explore
            run's hypotheses, asked at ``ExploreSettings.temperature``).
        structured_output: see :data:`StructuredOutput`.
        prices: model name -> :class:`ModelPrice` per million tokens (or a
            mapping of its fields, as a configuration file gives it).
        prompts: the templates (the shipped ones by default).
        max_retries, backoff_s, max_backoff_s: see ``BackoffPolicy``.
        timeout_s: seconds one HTTP request may take.
        max_output_tokens: sent as ``max_tokens`` when given.
        max_prompt_chars: the most characters a rendered prompt (system and
            user turns together) may take; None for no bound. Only the run's
            history is shortened: the oldest completed tasks and findings
            are left out, with a line saying how many; see
            :data:`MAX_PROMPT_CHARS` for the default. A request's own
            ``messages``, the output format and the tool loop come on top.
        provider_name: reported to telemetry (``openai``, ``vllm``...).
        client: an ``AsyncOpenAI`` to use instead of building one (it is not
            closed by :meth:`aclose`); its own retries are not made, only
            ``max_retries``.

    Raises:
        ConfigurationError: no model name, no key for OpenAI itself, an
            option out of range, or a price that is none.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        models: Mapping[str, str] | None = None,
        temperatures: Mapping[str, float] | None = None,
        structured_output: StructuredOutput = "auto",
        prices: Mapping[str, ModelPrice | Mapping[str, float]] | None = None,
        prompts: PromptRegistry | None = None,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 120.0,
        max_output_tokens: int | None = None,
        max_prompt_chars: int | None = MAX_PROMPT_CHARS,
        provider_name: str = "openai",
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        for option, text in (("model", model), ("base_url", base_url)):
            if text is not None and not isinstance(text, str):
                raise ConfigurationError(option, f"must be text, not {text!r}")
        if api_key is not None and not isinstance(api_key, str):
            # Not shown: it may be a key all the same.
            raise ConfigurationError("api_key", "must be text")
        # Stripped: an env file's newline would name a model no server has.
        # REPLAN_MODEL=openai:NAME, as replan serve takes it, names NAME.
        from_env = (os.environ.get("REPLAN_MODEL") or "").strip()
        name = (model or from_env.removeprefix("openai:")).strip()
        if not name:
            raise ConfigurationError(
                "model", "name a model (or set REPLAN_MODEL), e.g. gpt-4o-mini"
            )
        _check_name("model", name)
        _check_mapping("models", models, "model names by role")
        _check_mapping("temperatures", temperatures, "temperatures by role")
        for role, named in (models or {}).items():
            if role not in ROLES:
                raise ConfigurationError(
                    f"models.{role}",
                    f"no role {role!r}; the roles are {', '.join(ROLES)}",
                )
            if not isinstance(named, str) or not named.strip():
                raise ConfigurationError(
                    f"models.{role}", f"must be a model name, not {named!r}"
                )
            _check_name(f"models.{role}", named)
        for role, value in (temperatures or {}).items():
            if role not in TEMPERATURE_ROLES:
                raise ConfigurationError(
                    f"temperatures.{role}",
                    "only executor and evolver temperatures can be set; "
                    "planning, reviewing and ranking run at 0",
                )
            if finite_number(f"temperatures.{role}", value, minimum=0) > 2:
                raise ConfigurationError(f"temperatures.{role}", "must be 0 to 2")
        if structured_output not in _MODES:
            raise ConfigurationError(
                "structured_output", f"must be one of {', '.join(_MODES)}"
            )
        timeout_s = finite_number("timeout_s", timeout_s, minimum=0, above=True)
        if max_output_tokens is not None:
            max_output_tokens = whole_number(
                "max_output_tokens", max_output_tokens, minimum=1
            )
        if max_prompt_chars is not None:
            try:
                max_prompt_chars = whole_number(
                    "max_prompt_chars", max_prompt_chars, minimum=MIN_PROMPT_CHARS
                )
            except ConfigurationError as exc:
                raise ConfigurationError(
                    exc.field, f"{exc.problem} (or None for no bound)"
                ) from None
        self.name = name
        self.provider_name = provider_name
        # Stripped as the model's own name is: " gpt-4o\n" names no model.
        self.models = {
            role: str(named).strip() for role, named in (models or {}).items()
        }
        self.temperatures = dict(temperatures or {})
        self.structured_output: StructuredOutput = structured_output
        self._auto_modes: dict[str, StructuredOutput] = {}
        """Per model, the mode ``auto`` asks with: the last one the server
        took for it (``json_schema`` until one refuses it). Per model: one
        endpoint (a LiteLLM proxy, say) may serve models per role that
        differ in what they take."""
        self._no_temperature: set[str] = set()
        """Models that refused a temperature (reasoning models take none
        but their default): asked without one."""
        self._completion_tokens: set[str] = set()
        """Models that refused ``max_tokens`` for ``max_completion_tokens``."""
        self._no_usage: set[str] = set()
        self._odd_usage: set[str] = set()
        """Models whose answers came without token counts (warned once)."""
        self.prices = price_table(prices)
        if prompts is not None and not callable(getattr(prompts, "for_request", None)):
            raise ConfigurationError(
                "prompts",
                f"must be a PromptRegistry, not {type(prompts).__name__}: "
                "PromptRegistry().load_dir(path) for a directory of templates",
            )
        self.prompts = prompts or PromptRegistry()
        self.retry = BackoffPolicy(max_retries, backoff_s, max_backoff_s)
        self.max_output_tokens = max_output_tokens
        self.timeout_s = timeout_s
        self.max_prompt_chars = max_prompt_chars
        self._owns_client = client is None
        if client is None:
            # Stripped, as the key is: an env file's newline, a pasted space.
            url = (base_url or os.environ.get("OPENAI_BASE_URL") or "").strip() or None
            if url is not None:
                check_base_url(url, "" if base_url else " (from OPENAI_BASE_URL)")
            given = api_key is not None and api_key != ""
            key = _usable_key(
                api_key if given else os.environ.get("OPENAI_API_KEY"),
                "api_key" if given else "OPENAI_API_KEY",
            )
            if not key:
                if url is None or "api.openai.com" in url:
                    raise ConfigurationError(
                        "api_key",
                        "no API key: set OPENAI_API_KEY (or pass api_key), or "
                        "give base_url (or OPENAI_BASE_URL) for a local server",
                    )
                key = LOCAL_KEY
            self._client_options: dict[str, Any] = {
                "api_key": key,
                "base_url": url,
                "max_retries": 0,
                "timeout": timeout_s,
            }
            try:
                client = openai.AsyncOpenAI(**self._client_options)
            except Exception as exc:
                if type(exc).__name__ != "InvalidURL" or url is None:
                    raise
                problem = url_problem(url, str(exc), "", foreign=True)
                raise ConfigurationError("base_url", problem) from None
        self.client = client
        self._loop: object | None = None
        """The event loop the client built here was first used in."""
        self._requests = _without_retries(client)
        """The client the requests go through: ``client``, or a copy of a
        client passed in with its own retries turned off (it shares that
        client's connections)."""
        self.base_url = str(client.base_url)
        # For messages: a URL may carry credentials (user:password@host).
        self._where = without_credentials(self.base_url)

    def model_for(self, role: str) -> str:
        """The model name ``role`` asks."""
        return self.models.get(role, self.name)

    @property
    def otel_instrumented(self) -> bool:
        """Whether the OpenAI client's own instrumentation traces our calls
        (the ``openai-otel`` extra, activated by ``telemetry.setup()``): its
        spans then carry each call and its tokens, and replan adds none."""
        from ..telemetry._openai import openai_instrumented

        return openai_instrumented()

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # Answering ----------------------------------------------------------------

    async def generate(self, request: ModelRequest) -> ModelResponse:
        """Ask the endpoint; see the :class:`~replan.llm.Model` protocol.

        Raises:
            ModelAuthenticationError: the key was rejected (first answer).
            TransientModelError: retries used up on 429/5xx/timeouts.
            ModelRefusal: a refusal or a content-filter stop.
            ModelOutputError: the answer did not validate after one re-ask,
                or was cut short at the output token limit (not asked
                again), or is of the wrong shape (content that is no text).
            BudgetExhausted: the re-ask would pass ``request.token_allowance``.
            ModelError: any other failure.
        """
        started = time.perf_counter()
        model = self.model_for(request.role)
        where = f"{self._where} ({model})"
        base, version = self._prompt(request, log=True)
        schema, strict = response_schema(request.output_type)
        transcript = _transcript_messages(request)
        reask: list[dict[str, Any]] = []
        usage = TokenUsage()
        auto = self.structured_output == "auto"
        mode = (
            self._auto_modes.get(model, "json_schema")
            if auto
            else self.structured_output
        )
        refused: openai.BadRequestError | None = None
        invalid: str | None = None
        """The answer being asked again for, once it proved invalid."""
        while True:
            messages = base + transcript + reask

            async def create(
                mode: StructuredOutput = mode, messages: list[Any] = messages
            ) -> Any:
                return await self._create(
                    request, model, mode, schema, strict, messages
                )

            try:
                completion = await with_retries(create, self.retry, where)
            except openai.BadRequestError as exc:
                if self._drop_refused_parameter(model, exc):
                    continue  # asked again as the model takes it
                fallback = _FALLBACK.get(mode)
                # A re-ask: the server took this mode for the first answer.
                if auto and fallback is not None and invalid is None:
                    # Perhaps the server does not take this response_format:
                    # ask again with the next simpler one. Kept only once the
                    # server takes one (a 400 for another reason, a prompt
                    # too long, fails them all and changes nothing).
                    refused = refused or exc
                    mode = fallback
                    continue
                error = status_error(refused or exc, where)
                raise _annotated(_reasking(error, invalid, request), usage) from None
            except openai.APIStatusError as exc:
                error = status_error(exc, where)
                raise _annotated(_reasking(error, invalid, request), usage) from None
            except ModelError as exc:
                raise _annotated(exc, usage, invalid) from None
            except openai.OpenAIError as exc:
                raise ModelError(
                    f"{where}: {exc}", usage=_spent(usage), raw_output=invalid
                ) from None
            except Exception as exc:  # a body the client could not parse
                failed = "the request failed"  # before any answer came
                if not isinstance(exc, ExceptionGroup):
                    failed = "the answer could not be read"
                raise ModelError(
                    f"{where}: {failed}: {brief(exc)}",
                    usage=_spent(usage),
                    raw_output=invalid,
                ) from None
            if auto:
                self._auto_modes[model] = mode
            try:
                usage, choices, answered = self._read(
                    completion, request, model, where, usage
                )
            except ModelError as exc:
                raise _reasked(exc, invalid, request) from None
            if isinstance(answered, list):
                return ModelResponse(
                    tool_calls=answered,
                    usage=usage,
                    model=answered_by(completion, model),
                    latency_s=time.perf_counter() - started,
                    prompt_version=version,
                    reask=reask,
                )
            raw = answered
            try:
                output = parse_output(raw, request.output_type)
            except ValidationError as exc:
                problems = describe_errors(exc)
                if _cut_short(choices):
                    # Asked again, the answer would be cut at the same limit.
                    raise ModelOutputError(
                        f"{where}: the {request.role}'s answer was cut short at "
                        f"the output token limit ({self._output_limit()}) and "
                        f"is not a valid {request.output_type.__name__}:\n"
                        f"{problems}",
                        usage=usage,
                        raw_output=raw,
                        final=True,
                    ) from None
                if reask:
                    raise ModelOutputError(
                        f"{where}: the {request.role}'s answer is not a valid "
                        f"{request.output_type.__name__}, even after a re-ask:\n"
                        f"{problems}",
                        usage=usage,
                        raw_output=raw,
                        final=True,
                    ) from None
                allowance = request.token_allowance
                if allowance is not None and usage.total_tokens >= allowance:
                    raise BudgetExhausted(
                        f"token_budget: the re-ask of an invalid answer would pass "
                        f"the {allowance} tokens left",
                        usage=usage,
                        raw_output=raw,
                    ) from None
                invalid = raw
                reask += [
                    {"role": "assistant", "content": _echoed(raw)},
                    {
                        "role": "user",
                        "content": "Your answer could not be used:\n"
                        f"{problems}\nAnswer again with one JSON object that "
                        "matches the required schema, and nothing else.",
                    },
                ]
                continue
            return ModelResponse(
                output=output,
                usage=usage,
                model=answered_by(completion, model),
                latency_s=time.perf_counter() - started,
                prompt_version=version,
                reask=reask,
            )

    def _read(
        self,
        completion: Any,
        request: ModelRequest,
        model: str,
        where: str,
        usage: TokenUsage,
    ) -> tuple[TokenUsage, Any, list[ToolCall] | str]:
        """The call's usage with the answer's added, the answer's choices,
        and its tool calls or text.

        Raises:
            ModelOutputError: a body that is no chat completion, or an
                answer of the wrong shape (with the tokens it reports).
            ModelRefusal: a refusal or a content-filter stop.
            ModelError: a body with no choices but the server's error.
        """
        body = unparsed_body(completion)
        if body is not None:
            raise ModelOutputError(
                f"{where}: the answer is no chat completion: {body}",
                usage=_spent(usage),
                raw_output=completion[:4000] if isinstance(completion, str) else None,
                no_completion=True,
            )
        try:
            usage = usage + self._usage(completion, model)
            choices = completion.choices
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            raise ModelOutputError(
                f"{where}: the answer is no chat completion: {brief(exc)}",
                usage=_spent(usage),
                no_completion=True,
            ) from None
        reported = None if choices else reported_error(completion)
        if reported is not None:
            raise ModelError(
                f"{where}: the server answered with an error: {reported}",
                usage=usage,
            )
        return usage, choices, answer(choices, bool(request.tools), where, usage)

    async def _create(
        self,
        request: ModelRequest,
        model: str,
        mode: StructuredOutput,
        schema: dict[str, Any],
        strict: bool,
        messages: list[dict[str, Any]],
    ) -> Any:
        kwargs: dict[str, Any] = {"model": model}
        if model not in self._no_temperature:
            kwargs["temperature"] = self.temperature_for(request)
        name = request.output_type.__name__
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": strict},
            }
            instruction = f"Reply with one JSON object: a {name} in the given format."
        else:
            if mode == "json_object":
                kwargs["response_format"] = {"type": "json_object"}
            instruction = (
                f"Reply with one JSON object, a {name}, matching this JSON schema, "
                f"and nothing else:\n{schema_text(schema)}"
            )
        if request.tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if self.max_output_tokens is not None:
            limit = (
                "max_completion_tokens"
                if model in self._completion_tokens
                else "max_tokens"
            )
            kwargs[limit] = self.max_output_tokens
        kwargs["messages"] = _with_instruction(messages, instruction)
        # The client's timeout bounds each wait for bytes; a server that
        # trickles its answer would still hold the call without this.
        completions = self._client_here().chat.completions
        raw = getattr(completions, "with_raw_response", None)
        with anyio.fail_after(self.timeout_s):
            if raw is None:  # a client of another make: no HTTP answer to see
                return await completions.create(**kwargs)
            answered = await raw.create(**kwargs)
        # A 301, 302 or 303 is followed as a GET: a 200 for that (a login
        # page) is no answer of the endpoint's, whatever its body.
        moved = redirected_as_get(answered.http_response)
        if moved is not None:
            where = f"{self._where} ({model})"
            raise ModelError(f"{where}: {moved}: check the base URL")
        return answered.parse()

    def _client_here(self) -> Any:
        """The client to ask from this event loop.

        A client's pooled connections belong to the event loop that made
        them: used from another one (the model kept across ``anyio.run``
        calls, or by the tests of a suite that each run their own loop),
        every call would fail ("Event loop is closed"). A client built here
        is built again for the new loop; one passed in is the caller's.
        """
        if self._owns_client:
            loop = _event_loop()
            if loop is not None and loop != self._loop:
                if self._loop is not None:
                    self.client = self._requests = openai.AsyncOpenAI(
                        **self._client_options
                    )
                self._loop = loop
        return self._requests

    def _drop_refused_parameter(self, model: str, exc: openai.BadRequestError) -> bool:
        """Whether the 400 refused a parameter ``model`` can do without, now
        left out of its requests: a temperature (OpenAI's reasoning models
        take only their default), or ``max_tokens`` (which they want as
        ``max_completion_tokens``). Each is dropped once per model."""
        param = getattr(exc, "param", None)
        code = str(getattr(exc, "code", None) or "")
        if not code.startswith("unsupported_"):
            return False
        if param == "temperature" and model not in self._no_temperature:
            logger.info("%s takes no temperature: asking without one", model)
            self._no_temperature.add(model)
            return True
        if (
            param == "max_tokens"
            and self.max_output_tokens is not None
            and model not in self._completion_tokens
        ):
            self._completion_tokens.add(model)
            return True
        return False

    def prompt_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The chat messages sent for ``request`` on its first try.

        The request's own ``messages``, or its role's prompt rendered from
        its context, then the tool calls and results so far. (The structured
        output instruction some modes add, and a re-ask, come on top.)
        Telemetry records these when content capture is on.

        Raises:
            MissingPromptError: no template for the role and purpose.
        """
        base, _ = self._prompt(request)
        return base + _transcript_messages(request)

    def _prompt(
        self, request: ModelRequest, *, log: bool = False
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The base messages, and the template's label when one was used.

        With ``log``, what the prompt budget left out is logged (once per
        request: telemetry renders the prompt again without it).
        """
        if request.messages:
            return list(request.messages), None
        template = self.prompts.for_request(
            request.role, request.purpose, request.context
        )
        fitted = fit_prompt(template, request.context, self.max_prompt_chars)
        if log and (fitted.omitted or fitted.shortened):
            self._log_omitted(request, template.label, fitted)
        return fitted.messages, template.label

    def _log_omitted(
        self, request: ModelRequest, label: str, fitted: FittedPrompt
    ) -> None:
        # Expected in a long run's reviews and replans; the synthesis, which
        # writes the run's answer, missing results deserves a warning.
        level = logging.WARNING if request.purpose == "synthesize" else logging.DEBUG
        if not logger.isEnabledFor(level):
            return
        left_out = ", ".join(
            f"the oldest {count} of {len(request.context[key])} {key}"
            for key, count in fitted.omitted.items()
        )
        cut = ", ".join(f"{n} of {key}" for key, n in fitted.shortened.items())
        changes = "; ".join(
            part
            for part in (
                f"left out {left_out}" if left_out else "",
                f"cut short {cut}" if cut else "",
            )
            if part
        )
        over = ""
        if self.max_prompt_chars is not None and fitted.chars > self.max_prompt_chars:
            over = f"; still {fitted.chars} characters, with no history left"
        logger.log(
            level,
            "%s prompt of run %s: %s to fit %s characters%s",
            label,
            request.run_id or "-",
            changes,
            self.max_prompt_chars,
            over,
        )

    def _output_limit(self) -> str:
        if self.max_output_tokens is None:
            return "the server's own; set max_output_tokens to raise it"
        return f"max_output_tokens={self.max_output_tokens}"

    def temperature_for(self, request: ModelRequest) -> float:
        """The temperature sent for ``request``: the role's own setting for
        the executor and evolver, else the request's; the request's for an
        explore run's hypotheses (``ExploreSettings.temperature``); 0 for
        the others."""
        if request.role in TEMPERATURE_ROLES:
            return self.temperatures.get(request.role, request.temperature)
        if (request.role, request.purpose) in SAMPLED_PURPOSES:
            return request.temperature
        return 0.0

    def _usage(self, completion: Any, model: str) -> TokenUsage:
        usage = completion.usage
        if usage is None:
            if model not in self._no_usage:
                # Said once: a run's token budget and cost read these counts.
                self._no_usage.add(model)
                logger.warning(
                    "%s (%s) reports no token usage: its calls count 0 tokens, "
                    "so a token_budget does not bound them and they cost 0",
                    self._where,
                    model,
                )
            return TokenUsage(calls=1)
        details = getattr(usage, "prompt_tokens_details", None)
        reported = {
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
        }
        counts = {name: _token_count(value) for name, value in reported.items()}
        odd = [f"{n}={reported[n]!r}" for n, c in counts.items() if c is None]
        if odd and model not in self._odd_usage:
            # The answer itself is good: keep it, count what can be counted.
            self._odd_usage.add(model)
            logger.warning(
                "%s (%s) reports token counts that are no counts (%s): "
                "they count 0 tokens",
                self._where,
                model,
                ", ".join(odd)[:200],
            )
        tokens = TokenUsage(
            input_tokens=counts["prompt_tokens"] or 0,
            output_tokens=counts["completion_tokens"] or 0,
            cached_tokens=counts["cached_tokens"] or 0,
            calls=1,
        )
        return priced(tokens, model, self.prices)


def _token_count(value: object) -> int | None:
    """A reported token count as an int: 0 when not reported, None when
    what was reported is no count (negative, fractional, not a number)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and 0 <= value < 2**63:
        return value
    return None


def _usable_key(key: str | None, where: str) -> str | None:
    """``key`` without surrounding whitespace (the newline an env file
    leaves), if every character of it can go in an HTTP header.

    Raises:
        ConfigurationError: naming ``api_key`` and where the key came from,
            never showing it: the client would put it in its error message.
    """
    if key is None:
        return None
    key = key.strip()
    if any(not "!" <= c <= "~" for c in key):
        raise ConfigurationError(
            "api_key",
            f"the key in {where} holds a character an HTTP header cannot carry "
            "(a space, a control character or a letter that is no ASCII); "
            "it is not shown here",
        )
    return key


def _event_loop() -> object | None:
    """A token of the running event loop (equal for the same loop), or None
    with an anyio too old to tell (before 4.11)."""
    current = getattr(anyio.lowlevel, "current_token", None)
    return current() if current is not None else None


def _without_retries(client: Any) -> Any:
    """``client``, or a copy of it that makes no retries of its own.

    ``max_retries`` are replan's (with its ``Retry-After`` hold and its
    count in the error); an ``AsyncOpenAI`` retries twice by default, which
    would send up to three requests for each attempt counted here.
    """
    with_options = getattr(client, "with_options", None)
    if getattr(client, "max_retries", 0) and callable(with_options):
        return with_options(max_retries=0)
    return client


def _check_mapping(field: str, value: object, holds: str) -> None:
    """Refuse a ``models`` or ``temperatures`` that is no mapping (a model
    name for ``models``, a number for ``temperatures``)."""
    if value is not None and not isinstance(value, Mapping):
        raise ConfigurationError(
            field,
            f"must map roles to {holds.split(' by ')[0]} "
            f"(e.g. {{'executor': ...}}), not {value!r}",
        )


def _check_name(field: str, name: str) -> None:
    """Refuse a model name that is no text (a lone surrogate, as a shell
    argument of bytes that are no UTF-8 gives): no request can carry it,
    nor any journal the error that names it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            field, f"{name!r} is no text (a lone UTF-16 surrogate)"
        ) from None


def _cut_short(choices: Any) -> bool:
    """Whether the answer stopped at the output token limit."""
    return getattr(choices[0], "finish_reason", None) == "length"


def _spent(usage: TokenUsage) -> TokenUsage | None:
    """The tokens of the chat completions this call read so far, or None
    before any: a usage of no calls would count as one in the run's, for
    an answer that never came (a body that is no chat completion)."""
    return usage if usage.calls else None


def _annotated(
    exc: ModelError, usage: TokenUsage, invalid: str | None = None
) -> ModelError:
    """Add the tokens earlier attempts of this call used to ``exc``, and the
    invalid answer a re-ask was asking again for (for the journal)."""
    if usage.calls:
        exc.usage = usage + exc.usage if exc.usage else usage
    if invalid is not None and exc.raw_output is None:
        exc.raw_output = invalid
    return exc


def _reasking(
    error: ModelError, invalid: str | None, request: ModelRequest
) -> ModelError:
    """``error`` of a request, saying so when it was the re-ask of an invalid
    answer (kept as ``raw_output``): the first problem was that answer."""
    if invalid is None:
        return error
    return ModelError(f"{error} {_reask_note(request)}", raw_output=invalid)


def _reasked(
    error: ModelError, invalid: str | None, request: ModelRequest
) -> ModelError:
    """``error``, of an answer that could not be read, saying so when it
    answered the re-ask of an invalid answer, and keeping that answer as
    ``raw_output`` when it brought no text of its own (for the journal)."""
    if invalid is None:
        return error
    error.args = (f"{error} {_reask_note(request)}",)
    if error.raw_output is None:
        error.raw_output = invalid
    return error


def _reask_note(request: ModelRequest) -> str:
    return (
        "(when asked again after an answer that was not a valid "
        f"{request.output_type.__name__})"
    )


def _echoed(raw: str) -> str:
    """An invalid answer as shown back to the model: at most
    :data:`REASK_ECHO_CHARS` characters of it."""
    if len(raw) <= REASK_ECHO_CHARS:
        return raw
    return (
        f"{raw[:REASK_ECHO_CHARS]}\n(... {len(raw) - REASK_ECHO_CHARS} more characters)"
    )


def _transcript_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The tool loop so far as chat messages: calls, then their results."""
    messages: list[dict[str, Any]] = []
    for exchange in request.transcript:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in exchange.calls
                ],
            }
        )
        messages.extend(
            {
                "role": "tool",
                "tool_call_id": r.call_id,
                "content": f"error: {r.content}" if r.error else r.content,
            }
            for r in exchange.results
        )
    return messages


def _with_instruction(
    messages: list[dict[str, Any]], instruction: str
) -> list[dict[str, Any]]:
    """Add the output instruction to the first system message (or make one):
    some chat templates accept a system message only at the start."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{instruction}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]
