"""Whether an explore run still reaches its model, round by round.

An explore run goes on without an answer that failed (the call is recorded in
the brief's errors), so an endpoint that cannot be reached at all would take
the run through every cycle. A *round* is the evidence step or one cycle; a
round whose model calls all failed transiently (each after the adapter's
retries and ``max_task_attempts`` attempts) got nothing from the model. After
:data:`UNREACHABLE_ROUNDS` such rounds in a row the run ends ``failed``.

Two, not one: every failed call has already been retried for several seconds,
so two rounds mean the model stayed out of reach across several rounds of
retries, while a blip (a model server restarting) costs at most one round. A
run that never reached its model stops after its first cycle (the evidence
step is the first round). A round with one answer, even a malformed one,
reached the model and starts the count again; a round that asked nothing
(replayed from the journal) leaves it as it is.

An endpoint that answers, but never as a model does (a 404 for a wrong path
or model name, an HTML login page, JSON that is no chat completion), gives
every call the same answer whatever it asks. So the run also ends ``failed``
after :data:`UNREACHABLE_ROUNDS` rounds in a row in which every call failed
with no answer to read, all with the same error (its role and purpose
aside). One such call (a proxy that misroutes once), errors that differ, or
a model's answers, however malformed, leave the run going as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UNREACHABLE_ROUNDS = 2
"""Rounds in a row in which every model call failed transiently (or every
one failed with the same error) that end an explore run ``failed``."""


NO_ANSWER = "failed: "
"""How an explore call's error begins when no answer came to read (an HTTP
error, a body that is no chat completion), after its role and purpose."""


@dataclass(slots=True)
class Reach:
    """The model calls of the current round, and the rounds in a row that got
    nothing but transient failures (or nothing but the same failure)."""

    calls: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    """The round's transient failures: (role, what the call said)."""
    rounds: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    """The fruitless rounds in a row so far: (name, failures)."""
    unanswered: list[tuple[str, str | None, str]] = field(default_factory=list)
    """The round's calls that got no usable answer, not transiently: (role,
    the error its answers failed with, their role and purpose aside, or None
    when they failed in different ways; the call's last error)."""
    alike: list[tuple[str, list[tuple[str, str | None, str]]]] = field(
        default_factory=list
    )
    """The rounds in a row so far whose every call failed with the same
    error, the same in all of them: (name, calls)."""

    def asked(self) -> None:
        self.calls += 1

    def failed(self, role: str, detail: str) -> None:
        """A call failed on every attempt, the last one transiently."""
        self.failures.append((role, detail))

    def unusable(self, role: str, errors: list[str]) -> None:
        """A call got no usable answer; ``errors`` are what it recorded
        (``role/purpose: how: what``), one for each answer that failed."""
        causes = {error.partition(": ")[2] for error in errors}
        cause = causes.pop() if len(causes) == 1 else None
        if cause is not None and not cause.startswith(NO_ANSWER):
            cause = None  # answers of a model, malformed or refused
        self.unanswered.append((role, cause, errors[-1]))

    def end_round(self, name: str) -> str | None:
        """Close the round called ``name``; the stop reason when the model
        has now been out of reach (or answered every call alike) for
        :data:`UNREACHABLE_ROUNDS` rounds."""
        calls, failures, unanswered = self.calls, self.failures, self.unanswered
        self.calls, self.failures, self.unanswered = 0, [], []
        if not calls:
            return None
        if len(unanswered) == calls and self._alike(unanswered):
            self.alike.append((name, unanswered))
            if len(self.alike) >= UNREACHABLE_ROUNDS:
                return (
                    "the model endpoint gave no usable answer: every "
                    f"{_joined(_roles(self.alike))} call in "
                    f"{_joined([n for n, _ in self.alike])} failed the same way "
                    f"(last: {unanswered[-1][2]})"
                )
        else:
            self.alike.clear()
        if len(failures) < calls:
            self.rounds.clear()
            return None
        self.rounds.append((name, failures))
        if len(self.rounds) < UNREACHABLE_ROUNDS:
            return None
        last = self.rounds[-1][1][-1][1]
        return (
            f"the model could not be reached: every {_joined(_roles(self.rounds))} "
            f"call in {_joined([n for n, _ in self.rounds])} failed after its "
            f"retries (last: {last})"
        )

    def _alike(self, unanswered: list[tuple[str, str | None, str]]) -> bool:
        """Whether every call of a round failed with the same error, the
        error of the rounds in a row before it."""
        causes = {cause for _, cause, _ in unanswered}
        if self.alike:
            causes.add(self.alike[-1][1][0][1])
        return len(causes) == 1 and None not in causes


def _roles(rounds: list[tuple[str, list[tuple[Any, ...]]]]) -> list[str]:
    roles: list[str] = []
    for _, failed in rounds:
        roles.extend(r for r, *_ in failed if r not in roles)
    return roles


def _joined(words: list[str]) -> str:
    if len(words) < 2:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]
