"""``replan explore`` and ``replan demo --explore``: explore runs from the shell."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import _render
from ._cli_run import (
    DEFAULT_RETRIES,
    add_prompt_budget,
    add_resume,
    is_scripted,
    model_options,
    openai_model,
    unreachable_message,
    whole_number,
)
from ._demo_explore import explore_demo_model, explore_demo_spec
from ._errors import ConfigurationError
from ._render_explore import brief_lines
from .llm import Model
from .messages import ExploreSettings, Limits, RunResult, RunSpec, RunStatus
from .supervisor import RunState

if TYPE_CHECKING:
    from .cli import Console

DEMO_MODEL = "scripted:demo"

MAX_CONTEXT_CHARS = 64 * 1_048_576
"""The most a context file may hold: as much as a daemon takes in one
request, so that an endless file (``/dev/zero``, a pipe that never ends)
is refused rather than read until memory runs out."""


def make_model(
    name: str | None,
    base_url: str | None,
    retries: int = 3,
    max_prompt_chars: int | None = 100_000,
) -> Model:
    """The model ``--model NAME`` (and ``--base-url``) names.

    ``scripted:demo`` answers offline with the explore demo's script.

    Raises:
        CommandError: no model was named, or this build cannot make it.
    """
    from .cli import CommandError

    name = (name or "").strip()  # as the model strips it: an env file's newline
    if not name:
        raise CommandError(
            f"give a model with --model (or REPLAN_MODEL); {DEMO_MODEL} runs offline",
            code=2,
        )
    if is_scripted(name):
        return explore_demo_model()
    return openai_model(
        name.removeprefix("openai:"),
        base_url,
        max_retries=retries,
        max_prompt_chars=max_prompt_chars,
    )


def add_explore_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    explore = commands.add_parser(
        "explore",
        help="explore a question: hypotheses, reviewed, ranked and briefed",
        description="Generate hypotheses for GOAL from the context files, review "
        "them on seven lenses, rank them by tournament, keep a diverse set, and "
        "print a discovery brief with a validation step for each.",
    )
    explore.add_argument(
        "goal", metavar="GOAL", nargs="?", help="the open question to explore"
    )
    explore.add_argument(
        "--context",
        metavar="FILE",
        nargs="+",
        default=None,
        help="text files of evidence (paragraphs become evidence items)",
    )
    explore.add_argument(
        "--model",
        default=os.environ.get("REPLAN_MODEL"),
        help=f"the model to ask ({DEMO_MODEL} runs offline)",
    )
    explore.add_argument("--base-url", help="an OpenAI-compatible endpoint")
    explore.add_argument(
        "--retries",
        type=whole_number(0),
        default=DEFAULT_RETRIES,
        help=f"retries per model call on 429/5xx/timeouts (default {DEFAULT_RETRIES})",
    )
    add_prompt_budget(explore)
    explore.add_argument("--domain", help="the domain, for the safety screen")
    explore.add_argument(
        "--select", type=int, help=f"hypotheses to select (default {SELECT})"
    )
    explore.add_argument(
        "--max-iterations", type=int, help=f"cycles at most (default {ITERATIONS})"
    )
    explore.add_argument("--seed", type=int, help="the tournament's seed (default 0)")
    explore.add_argument("--yes", action="store_true", help="approve every review")
    explore.add_argument(
        "--json", action="store_true", help="print only the run result as JSON"
    )
    explore.add_argument("--db", metavar="PATH", help="journal the run in this file")
    add_resume(explore, "explore run", "model")  # explore takes no --tool


SELECT = 3
"""Hypotheses selected unless ``--select`` says otherwise."""

ITERATIONS = 3
"""Cycles at most unless ``--max-iterations`` says otherwise."""

EXPLORE_SPEC_FLAGS = {
    "context": "--context",
    "domain": "--domain",
    "select": "--select",
    "max_iterations": "--max-iterations",
    "seed": "--seed",
}
"""The flags of ``replan explore`` that make its spec (not for ``--resume``);
each defaults to None, its default applied when the spec is made."""


def explore_spec_from(args: argparse.Namespace) -> RunSpec:
    from .cli import CommandError

    context: list[str] = []
    for name in args.context or []:
        try:
            with Path(name).open(encoding="utf-8") as file:
                text = file.read(MAX_CONTEXT_CHARS + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(
                f"cannot read context file {name}: {exc}", code=2
            ) from None
        if len(text) > MAX_CONTEXT_CHARS:
            raise CommandError(
                f"cannot read context file {name}: it is larger than "
                f"{MAX_CONTEXT_CHARS // 1_048_576} MiB",
                code=2,
            )
        context.append(text)
    try:
        spec = RunSpec(
            goal=args.goal,
            kind="explore",
            context=context,
            limits=Limits(max_iterations=_or(args.max_iterations, ITERATIONS)),
            explore=ExploreSettings(
                domain=args.domain or "",
                select=_or(args.select, SELECT),
                seed=_or(args.seed, 0),
            ),
        )
        # An argument the shell passed as bytes that are no UTF-8 (a lone
        # surrogate) cannot be journaled: a bad argument, not a failed run.
        spec.check_storable()
    except ConfigurationError as exc:
        name = exc.field.rpartition(".")[2]
        if name in _FLAGS:
            raise CommandError(f"{_FLAGS[name]}: {exc.problem}", code=2) from None
        raise CommandError(str(exc), code=2) from None
    return spec


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


_FLAGS = {
    "domain": "--domain",
    "select": "--select",
    "seed": "--seed",
    "max_iterations": "--max-iterations",
}
"""The flag that gives each setting, for error lines."""


async def explore(console: Console, args: argparse.Namespace) -> int:
    """``replan explore``: run one explore run (or go on with one, with
    ``--resume``) and print its brief."""
    spec = None if args.resume else explore_spec_from(args)
    model = make_model(args.model, args.base_url, args.retries, args.max_prompt_chars)
    again = ["replan explore", *model_options(args)]
    return await _run(
        console,
        model,
        spec,
        yes=args.yes,
        as_json=args.json,
        db=args.db,
        resume=args.resume,
        again=" ".join(again),
    )


async def explore_demo(
    console: Console, *, yes: bool, as_json: bool, db: str | None, latency: float
) -> int:
    """``replan demo --explore``: the offline explore scenario."""
    model = explore_demo_model(latency)
    return await _run(
        console,
        model,
        explore_demo_spec(),
        yes=yes,
        as_json=as_json,
        db=db,
        again=f"replan explore --model {DEMO_MODEL}",
    )


async def _run(
    console: Console,
    model: Model,
    spec: RunSpec | None,
    *,
    yes: bool,
    as_json: bool,
    db: str | None,
    resume: str | None = None,
    again: str,
) -> int:
    from .cli import CommandError, supervise

    result = await supervise(
        console,
        model,
        spec,
        yes=yes,
        as_json=as_json,
        db=db,
        report=report,
        resume=resume,
        kind="explore",
        again=again,
    )
    if result.status is not RunStatus.COMPLETED:
        unreachable = unreachable_message(result, model)
        if unreachable is not None:
            raise CommandError(unreachable)
        reason = f": {result.stop_reason}" if result.stop_reason else ""
        failures = [f.message for f in result.model_failures]
        if (
            result.status is RunStatus.FAILED
            and failures
            and failures[-1] not in reason
        ):
            reason += f"; the model's last error: {failures[-1]}"
        raise CommandError(f"the explore run ended {result.status.value}{reason}")
    return 0


def report(state: RunState, result: RunResult) -> list[str]:
    """The brief, then the usage by role."""
    lines = brief_lines(result.brief) if result.brief else ["no brief was issued"]
    lines += ["", "usage by role"]
    lines.extend(_render.usage_lines(result.usage))
    return lines
