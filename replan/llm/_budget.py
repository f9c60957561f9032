"""A size budget for rendered prompts: the oldest list entries give way first.

A long run's context carries every completed task and finding, so its
reviewer, planner, ranker and evolver prompts grow with the run. Only that
history is shortened (the lists under :data:`HISTORY_KEYS`), from the oldest
end (lists are oldest first), and a shortened list opens with a line saying
how many entries were left out, so the model knows that something is
missing. Everything else is sent whole: the goal, the requester's
background, the pending tasks a reviewer names in ``affected_tasks``, the
proposed tasks a ranker answers one by one. A prompt that does not fit even
with its history left out is sent so, and the provider's answer says it is
too long.

First, an entry that alone takes more than half the room the history has
(a task's result of a hundred thousand characters, say) is cut short, with
:data:`ENTRY_MARK` at its end, so that it does not take every older entry
with it. Then the longest lists give way first: each is held to one size
limit in the prompt, the largest at which the prompt fits. A list within the
limit stays whole, and the lists that are cut end up about the same size.
Each list's entries are rendered once and the limit is found by bisection on
their lengths; the prompt is rendered once more, as cut.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any, Final

from ._prompts import _PLACEHOLDER, PromptTemplate
from ._values import ListText, list_text

HISTORY_KEYS: Final = frozenset({"completed", "findings"})
"""The context lists a prompt over its budget may shorten: the run's
history, completed tasks and findings."""


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    """A template's chat messages, shortened to fit a budget where needed."""

    messages: list[dict[str, Any]]
    omitted: dict[str, int]
    """Entries left out, by context key; empty when the prompt fit whole."""
    shortened: dict[str, int]
    """Entries cut short (see :data:`ENTRY_MARK`), by context key."""
    chars: int
    """The length of every message's content, together."""


def fit_prompt(
    template: PromptTemplate,
    context: Mapping[str, Any],
    max_chars: int | None,
    keys: frozenset[str] = HISTORY_KEYS,
) -> FittedPrompt:
    """``template`` rendered from ``context`` within ``max_chars`` characters
    (None: no bound), shortening the lists under ``keys`` only.

    A prompt that fits is exactly ``template.render(context)``.
    """
    messages = template.render(context)
    size = prompt_chars(messages)
    if max_chars is None or size <= max_chars:
        return FittedPrompt(messages, {}, {}, size)
    uses = Counter(_PLACEHOLDER.findall(template.system + template.user))
    cuts = [
        _Cut(key, list_text(value), count)
        for key, count in uses.items()
        if key in keys and isinstance(value := context.get(key), list) and value
    ]
    rest = size - sum(cut.room(0) for cut in cuts)  # what is never cut
    # No one entry may take more than half the room the history has: a huge
    # newest result is cut short rather than dropped with all before it.
    cap = max((max_chars - rest) // 2, MIN_ENTRY_CHARS)
    cuts = [cut.capped(cap) for cut in cuts]

    def cut_to(limit: int) -> list[int]:
        return [cut.dropped_for(limit) for cut in cuts]

    def fits(dropped: list[int]) -> bool:
        rooms = (cut.room(d) for cut, d in zip(cuts, dropped, strict=True))
        return rest + sum(rooms) <= max_chars

    if fits([0] * len(cuts)):
        dropped = [0] * len(cuts)  # cutting the longest entries short was enough
    elif not fits(cut_to(0)):
        dropped = [cut.total for cut in cuts]  # only what is never cut is left
    else:
        # The largest limit that fits: fits(cut_to(low)), not fits(cut_to(high)).
        low, high = 0, max(cut.room(0) for cut in cuts)
        while high - low > 1:
            middle = (low + high) // 2
            if fits(cut_to(middle)):
                low = middle
            else:
                high = middle
        dropped = cut_to(low)
    pairs = list(zip(cuts, dropped, strict=True))
    texts = {cut.key: cut.text(d) for cut, d in pairs if d or cut.shortened}
    messages = template._render(context, texts)
    omitted = {cut.key: d for cut, d in pairs if d}
    shortened = {cut.key: cut.shortened for cut, d in pairs if cut.shortened}
    return FittedPrompt(messages, omitted, shortened, prompt_chars(messages))


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """The length of the messages' text contents, together."""
    return sum(len(m["content"]) for m in messages if isinstance(m["content"], str))


def omission_note(count: int) -> str:
    """The line that stands for ``count`` entries left out of a list."""
    entries = "entry" if count == 1 else "entries"
    return f"({count} earlier {entries} left out to fit the prompt)"


ENTRY_MARK: Final = " [...cut short to fit the prompt]"
"""Ends an entry that alone took more than half the history's room."""
MIN_ENTRY_CHARS: Final = 1_000
"""Entries up to this long are never cut short, only left out."""


@dataclass(frozen=True, slots=True)
class _Cut:
    """One list value of the context, to be shortened from its oldest end."""

    key: str
    rendered: ListText
    uses: int
    """How often the template shows the list."""
    shortened: int = 0
    """How many of its entries were cut short (see :meth:`capped`)."""
    _ends: list[int] = field(init=False)
    """Where each entry ends in the entries laid end to end (0 first)."""

    def __post_init__(self) -> None:
        ends = list(accumulate(map(len, self.rendered.entries), initial=0))
        object.__setattr__(self, "_ends", ends)

    @property
    def total(self) -> int:
        return len(self.rendered.entries)

    def capped(self, cap: int) -> _Cut:
        """The list with each entry longer than ``cap`` cut to it, the mark
        at its end (not the items of a JSON array: they would not parse)."""
        rendered = self.rendered
        if rendered.opening or all(len(e) <= cap for e in rendered.entries):
            return self
        keep = cap - len(ENTRY_MARK)
        entries = tuple(
            e if len(e) <= cap else e[:keep] + ENTRY_MARK for e in rendered.entries
        )
        short = sum(len(e) > cap for e in rendered.entries)
        return _Cut(self.key, replace(rendered, entries=entries), self.uses, short)

    def room(self, dropped: int) -> int:
        """The characters the list takes in the prompt, every use counted,
        with its ``dropped`` oldest entries left out."""
        rendered, total = self.rendered, self.total
        if dropped == total:
            return self.uses * len(omission_note(total))
        length = (
            self._ends[total]
            - self._ends[dropped]
            + len(rendered.separator) * (total - dropped - 1)
            + len(rendered.opening)
            + len(rendered.closing)
        )
        if dropped:
            length += len(omission_note(dropped)) + 1  # the note's own line
        return self.uses * length

    def dropped_for(self, limit: int) -> int:
        """How many entries to leave out to take at most ``limit`` characters:
        none when the list fits whole, else as few as will do, else all.

        Once one entry is out, every further one shortens the list (an entry
        and its separator outweigh the note's extra digit), so the search is
        a bisection. A list shorter whole than its note alone stays whole.
        """
        whole = self.room(0)
        if whole <= max(limit, self.room(self.total)):
            return 0
        cuts = range(1, self.total + 1)
        return 1 + min(
            bisect_left(cuts, -limit, key=lambda d: -self.room(d)), self.total - 1
        )

    def text(self, dropped: int) -> str:
        """The list with its ``dropped`` oldest entries left out: the note,
        then the entries kept."""
        if not dropped:
            return self.rendered.text()
        note = omission_note(dropped)
        if dropped == self.total:
            return note
        return f"{note}\n{self.rendered.text(dropped)}"
