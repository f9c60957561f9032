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
"""

from __future__ import annotations

from dataclasses import dataclass, field

UNREACHABLE_ROUNDS = 2
"""Rounds in a row in which every model call failed transiently that end an
explore run ``failed``."""


@dataclass(slots=True)
class Reach:
    """The model calls of the current round, and the rounds in a row that got
    nothing but transient failures."""

    calls: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    """The round's transient failures: (role, what the call said)."""
    rounds: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    """The fruitless rounds in a row so far: (name, failures)."""

    def asked(self) -> None:
        self.calls += 1

    def failed(self, role: str, detail: str) -> None:
        """A call failed on every attempt, the last one transiently."""
        self.failures.append((role, detail))

    def end_round(self, name: str) -> str | None:
        """Close the round called ``name``; the stop reason when the model
        has now been out of reach for :data:`UNREACHABLE_ROUNDS` rounds."""
        calls, failures = self.calls, self.failures
        self.calls, self.failures = 0, []
        if not calls:
            return None
        if len(failures) < calls:
            self.rounds.clear()
            return None
        self.rounds.append((name, failures))
        if len(self.rounds) < UNREACHABLE_ROUNDS:
            return None
        roles: list[str] = []
        for _, failed in self.rounds:
            roles.extend(r for r, _ in failed if r not in roles)
        names = [n for n, _ in self.rounds]
        last = self.rounds[-1][1][-1][1]
        return (
            f"the model could not be reached: every {_joined(roles)} call in "
            f"{_joined(names)} failed after its retries (last: {last})"
        )


def _joined(words: list[str]) -> str:
    if len(words) < 2:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]
