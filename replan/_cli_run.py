"""``replan run "GOAL"``: a real run on an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from . import _render
from ._demo import demo_model
from ._errors import ConfigurationError
from .llm import Model
from .messages import GatePolicy, Limits, RunResult, RunSpec, RunStatus

LIMIT_FLAGS: dict[str, tuple[str, type, str]] = {
    "max_replans": ("--max-replans", int, "applied replans allowed (default 3)"),
    "max_iterations": (
        "--max-iterations",
        int,
        "milestone reviews by the reviewer (default 20)",
    ),
    "max_task_executions": (
        "--max-task-executions",
        int,
        "task attempts started (default 200)",
    ),
    "max_concurrency": ("--max-concurrency", int, "tasks at once (default 4)"),
    "token_budget": ("--token-budget", int, "tokens the run may use in all"),
    "deadline_s": ("--deadline", float, "seconds the run may take"),
    "replan_candidates": (
        "--replan-candidates",
        int,
        "revisions per replan, ranked (default 1)",
    ),
    "gate_timeout_s": (
        "--gate-timeout",
        float,
        "seconds a gate waits before it is rejected",
    ),
}


DEFAULT_RETRIES = 3
"""``--retries`` unless given."""

DEFAULT_PROMPT_CHARS = 100_000
"""``--max-prompt-chars`` unless given."""


def add_run_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a goal with a model on an OpenAI-compatible endpoint",
        description="Plan, execute, review and replan GOAL with real model calls. "
        "The key comes from OPENAI_API_KEY, the endpoint from --base-url or "
        "OPENAI_BASE_URL (OpenAI by default), the model from --model or "
        "REPLAN_MODEL.",
    )
    run.add_argument(
        "goal", metavar="GOAL", nargs="?", help="what the run should achieve"
    )
    run.add_argument(
        "--pattern",
        choices=("discovery", "contract", "hybrid"),
        default=None,
        help="how the plan may change (default discovery)",
    )
    run.add_argument(
        "--model",
        help="model name (else REPLAN_MODEL); scripted:demo answers offline",
    )
    run.add_argument(
        "--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1"
    )
    run.add_argument(
        "--provider", default=None, help="provider name for telemetry (e.g. vllm)"
    )
    run.add_argument(
        "--structured-output",
        choices=("auto", "json_schema", "json_object", "prompt"),
        default="auto",
        help="how the answer's JSON shape is requested (default auto)",
    )
    run.add_argument(
        "--retries",
        type=whole_number(0),
        default=DEFAULT_RETRIES,
        help=f"retries per model call on 429/5xx/timeouts (default {DEFAULT_RETRIES})",
    )
    add_prompt_budget(run)
    run.add_argument(
        "--tool",
        action="append",
        dest="tools",
        metavar="MODULE:NAME",
        help="an executor tool, or a list of them (repeat for more); a "
        "side-effect tool's calls ask at a gate",
    )
    for field, (flag, kind, text) in LIMIT_FLAGS.items():
        run.add_argument(flag, dest=field, type=kind, default=None, help=text)
    run.add_argument("--yes", action="store_true", help="approve every gate")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--db", metavar="PATH", help="journal the run in this SQLite file")
    add_resume(run, "run")


RUN_SPEC_FLAGS = {"pattern": "--pattern"} | {
    field: flag for field, (flag, _, _) in LIMIT_FLAGS.items()
}
"""The flags of ``replan run`` that make its spec (not for ``--resume``);
each defaults to None, its default applied when the spec is made."""


def add_resume(
    parser: argparse.ArgumentParser, command: str, given: str = "model and tools"
) -> None:
    """``--resume RUN_ID``: go on with an unfinished run of the ``--db`` journal,
    with what ``given`` names taken from the command line."""
    parser.add_argument(
        "--resume",
        metavar="RUN_ID",
        help=f"go on with an unfinished {command} of the --db journal (an id or "
        f"a unique prefix), with the {given} given now; its goal and "
        "settings come from the journal",
    )


def check_resume(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    spec_flags: dict[str, str],
    what: str,
) -> None:
    """Either a new run (``what``: GOAL, QUESTION) or ``--resume`` with
    ``--db``, never both, and no flag that would change the journaled spec."""
    if args.resume is None:
        if args.goal is None:
            parser.error(f"{args.command}: give {what}, or --resume RUN_ID --db PATH")
        return
    if args.goal is not None:
        parser.error(
            f"{args.command}: --resume takes the run's {what} from the journal; "
            f"give one or the other"
        )
    if not args.db:
        parser.error(f"{args.command}: --resume needs --db PATH, the run's journal")
    for dest, flag in spec_flags.items():
        if getattr(args, dest) is not None:
            parser.error(
                f"{args.command}: {flag} cannot change a journaled run "
                "(--resume goes on with the settings it started with)"
            )


def add_prompt_budget(parser: argparse.ArgumentParser) -> None:
    """``--max-prompt-chars``: the model's prompt budget (see ``OpenAIModel``)."""
    parser.add_argument(
        "--max-prompt-chars",
        type=prompt_budget,
        default=DEFAULT_PROMPT_CHARS,
        metavar="N",
        help="longest prompt in characters; the oldest history is left out "
        "beyond it (default 100000; 0: no bound)",
    )


def prompt_budget(text: str) -> int | None:
    """An argparse type: a prompt budget of at least 1000 characters, or 0
    (None: no bound)."""
    value = whole_number(0)(text)
    if value == 0:
        return None
    if value < 1_000:
        raise argparse.ArgumentTypeError(
            f"must be at least 1000, or 0 for no bound: {text!r}"
        )
    return value


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number, ``minimum`` or more (and at most
    ``maximum`` if given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            bound = "0 or more" if minimum == 0 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {bound}: {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}: {text!r}")
        return value

    return parse


async def run_goal(console: Any, args: argparse.Namespace) -> int:
    """Run ``args.goal`` and print its progress, summary, usage and cost."""
    from .cli import CommandError, supervise
    from .llm._tools import import_tools

    limits = {f: getattr(args, f) for f in LIMIT_FLAGS if getattr(args, f) is not None}
    spec: RunSpec | None = None
    if args.resume is None:
        try:
            spec = RunSpec(
                goal=args.goal,
                pattern=args.pattern or "discovery",
                limits=Limits(**limits),
                gate_policy=GatePolicy(on_timeout="reject"),
            )
        except ConfigurationError as exc:
            raise CommandError(_flag_message(exc, args.base_url), code=2) from None
    model: Model
    # Stripped as the model strips it (an env file's newline), so that the
    # openai: prefix below is seen.
    name = (args.model or os.environ.get("REPLAN_MODEL") or "").strip() or None
    if is_scripted(name):
        model = demo_model()
    else:
        model = openai_model(
            # openai:NAME as replan serve and explore take it (REPLAN_MODEL
            # may be set for the daemon): the server knows the model as NAME.
            name.removeprefix("openai:") if name else None,
            args.base_url,
            max_retries=args.retries,
            max_prompt_chars=args.max_prompt_chars,
            structured_output=args.structured_output,
            provider_name=args.provider or _provider(args.base_url),
        )
    try:
        tools = import_tools(args.tools or [])
    except ConfigurationError as exc:
        raise CommandError(_flag_message(exc, args.base_url), code=2) from None
    result = await supervise(
        console,
        model,
        spec,
        tools=tools,
        yes=args.yes,
        as_json=args.json,
        db=args.db,
        resume=args.resume,
        again=_again(args),
        report=lambda state, result: [
            *_render.outcome_lines(state),
            *cost_lines(result),
        ],
    )
    if result.status is RunStatus.FAILED:
        raise CommandError(_failure_message(result, model))
    return 0 if result.status is RunStatus.COMPLETED else 1


def _again(args: argparse.Namespace) -> str:
    """The command that goes on with this run, bar ``--resume``, ``--db``,
    ``--yes`` and ``--json`` (which the caller adds)."""
    return " ".join(["replan run", *model_options(args)])


def model_options(args: argparse.Namespace) -> list[str]:
    """The options given of those that make the model and tools (``run``'s
    and ``explore``'s), quoted for a shell: a run resumed takes them again
    from the command line, not from its journal.

    The model and endpoint taken from ``REPLAN_MODEL`` and
    ``OPENAI_BASE_URL`` are given as ``--model`` and ``--base-url``, so
    that the command works in a shell without them; the ``user:password@``
    of that URL is left out (a flag's, typed on the command line, is
    kept), and no key is ever shown.
    """
    words = []
    model = (args.model or os.environ.get("REPLAN_MODEL") or "").strip()
    if model:
        words.append(f"--model {shlex.quote(model)}")
    if args.base_url:
        words.append(f"--base-url {shlex.quote(args.base_url)}")
    elif url := (os.environ.get("OPENAI_BASE_URL") or "").strip():
        words.append(f"--base-url {shlex.quote(without_credentials(url))}")
    if getattr(args, "provider", None):
        words.append(f"--provider {shlex.quote(args.provider)}")
    if getattr(args, "structured_output", "auto") != "auto":
        words.append(f"--structured-output {args.structured_output}")
    if args.retries != DEFAULT_RETRIES:
        words.append(f"--retries {args.retries}")
    if args.max_prompt_chars != DEFAULT_PROMPT_CHARS:
        words.append(f"--max-prompt-chars {args.max_prompt_chars or 0}")
    words += [
        f"--tool {shlex.quote(tool)}" for tool in getattr(args, "tools", None) or []
    ]
    return words


SCRIPTED_MODELS = ("scripted:demo",)
"""The models that answer offline from a script (the demo's)."""


def is_scripted(name: str | None) -> bool:
    """Whether ``--model NAME`` names a scripted model.

    Raises:
        CommandError: ``NAME`` is ``scripted:`` and no scripted model known.
    """
    from .cli import CommandError

    if name is None or not name.startswith("scripted:"):
        return False
    if name not in SCRIPTED_MODELS:
        raise CommandError(
            f"--model: no scripted model {name!r}; known: {', '.join(SCRIPTED_MODELS)}",
            code=2,
        )
    return True


def openai_model(name: str | None, base_url: str | None, **options: Any) -> Model:
    """``OpenAIModel(name, base_url=base_url, **options)``.

    Raises:
        CommandError: (exit 2) a setting the model refuses, named as the
            flag or variable that gave it.
    """
    import httpx

    from .cli import CommandError
    from .llm import OpenAIModel  # here: openai takes a while to import

    try:
        return OpenAIModel(name, base_url=base_url, **options)
    except ConfigurationError as exc:
        raise CommandError(_flag_message(exc, base_url), code=2) from None
    except (httpx.InvalidURL, ValueError) as exc:  # a URL the client cannot use
        problem = without_credentials(f"not a usable URL: {exc}")
        flag = _url_flag(base_url)
        raise CommandError(f"{flag}: {problem}", code=2) from None


def cost_lines(result: RunResult) -> list[str]:
    lines = ["", "cost"]
    lines.append(f"  total {result.cost:.4f}" if result.cost else "  (no price table)")
    lines.append(f"  replanning tokens {result.replanning_tokens}")
    ratio = result.cost_to_discovery
    if ratio is not None:
        lines.append(f"  tokens per applied replan {ratio:.0f}")
    return lines


def _provider(base_url: str | None) -> str:
    """The provider a server's address suggests (``--base-url``, else
    ``OPENAI_BASE_URL``, as the model takes it); ``openai`` by default."""
    url = (base_url or os.environ.get("OPENAI_BASE_URL") or "").strip()
    try:
        port = urlsplit(url).port
    except ValueError:  # no usable URL: the model refuses it
        return "openai"
    return PROVIDER_PORTS.get(port, "openai") if port is not None else "openai"


PROVIDER_PORTS = {11434: "ollama", 8000: "vllm", 4000: "litellm"}
"""The servers whose default port tells them apart (``--provider`` unless given)."""


def _flag_message(exc: ConfigurationError, base_url: str | None) -> str:
    if exc.field == "api_key":
        if not exc.problem.startswith("no API key"):
            return exc.problem  # it names OPENAI_API_KEY
        return "no API key: set OPENAI_API_KEY or pass --base-url for a local server"
    if exc.field == "model":
        if exc.problem.startswith("name a model"):
            return "no model: pass --model NAME or set REPLAN_MODEL"
        return f"--model: {exc.problem}"
    if exc.field == "tools":
        return f"--tool: {exc.problem}"
    if exc.field == "base_url":
        problem = without_credentials(exc.problem)
        if base_url is None and "OPENAI_BASE_URL" in problem:
            return problem
        return f"{_url_flag(base_url)}: {problem}"
    name = exc.field.removeprefix("limits.")
    if name in LIMIT_FLAGS:
        return f"{LIMIT_FLAGS[name][0]}: {exc.problem}"
    return str(exc)


def _url_flag(base_url: str | None) -> str:
    """Where the model's base URL came from."""
    return "--base-url" if base_url else "OPENAI_BASE_URL"


def _failure_message(result: RunResult, model: Model) -> str:
    unreachable = unreachable_message(result, model)
    if unreachable is not None:
        return unreachable
    reason = " ".join((result.stop_reason or "no reason given").split())
    return f"the run failed: {reason}"


_CONNECT_FAILURES = (
    "all connection attempts failed",  # httpx over anyio: refused, unroutable
    "connection refused",
    "name or service not known",
    "nodename nor servname",
    "temporary failure in name resolution",
    "no address associated with hostname",
    "getaddrinfo failed",
    "no route to host",
    "network is unreachable",
    "cannot assign requested address",
)
"""What a model error says when no connection could be made at all."""


def unreachable_message(result: RunResult, model: Model) -> str | None:
    """What to say when the run failed because nothing answered at the
    model's base URL; None when it failed otherwise (a server that took
    the connection and dropped it, say: its own error says so).
    """
    base_url = getattr(model, "base_url", None)
    if not isinstance(base_url, str):
        return None  # a model with no endpoint (scripted)
    messages = [f.message for f in result.model_failures]
    if result.brief is not None:
        messages += result.brief.errors  # an explore run records them here
    if any(_could_not_connect(m) for m in messages):
        return (
            f"cannot reach the model endpoint at {without_credentials(base_url)}: "
            "check --base-url (or OPENAI_BASE_URL) and that the server is running"
        )
    return None


def _could_not_connect(message: str) -> bool:
    _, found, cause = message.lower().partition("cannot connect")
    return bool(found) and any(text in cause for text in _CONNECT_FAILURES)


_CREDENTIALS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")


def without_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of each URL in it left out."""
    return _CREDENTIALS.sub(r"\1", text)
