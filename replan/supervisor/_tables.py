"""Immutable tables of a run's state that a fold updates without copying them.

A run's state is immutable: each event folds into a copy of it (``apply``
is pure, and states held across events must not change). A plain dict or
list copy costs as much as the table is long, so in a plan of thousands of
tasks every event would copy thousands of entries. Small tables stay plain
dicts and lists, the cheapest to copy and to read; past :data:`SMALL`
entries they become these tables, which share all but a chunk of
:data:`CHUNK` entries with the version they were made from.
"""

from __future__ import annotations

from collections.abc import (
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    ValuesView,
)
from itertools import chain
from typing import Any, overload

from ..messages import Task

CHUNK = 64
"""Entries per chunk: what an update copies besides the list of chunks."""
_SHIFT = 6
_MASK = CHUNK - 1
SMALL = 256
"""The most entries a table keeps as a plain dict or list."""


class TaskTable(Mapping[str, Task]):
    """Tasks by id, in the order planned, for plans too large to copy per event.

    The tasks sit in chunks of :data:`CHUNK`, by their position in the plan;
    an update copies the chunks it changes and the list of chunks (a 64th
    of the table), and shares the rest, and the ids' positions, with the
    table it was made from. Neither table is changed.
    """

    __slots__ = ("_chunks", "_positions")

    def __init__(self, positions: dict[str, int], chunks: list[list[Task]]) -> None:
        # Never changed once a table holds them: later versions share them.
        self._positions = positions
        self._chunks = chunks

    @classmethod
    def of(cls, tasks: Iterable[Task]) -> TaskTable:
        """A table of ``tasks``, in their order."""
        ordered = list(tasks)
        positions = {task.id: i for i, task in enumerate(ordered)}
        if len(positions) != len(ordered):
            raise ValueError("a task table holds each task id once")
        chunks = [ordered[i : i + CHUNK] for i in range(0, len(ordered), CHUNK)]
        return cls(positions, chunks)

    def __getitem__(self, key: str) -> Task:
        i = self._positions[key]
        return self._chunks[i >> _SHIFT][i & _MASK]

    @overload
    def get(self, key: str, /) -> Task | None: ...
    @overload
    def get(self, key: str, default: Task | Any, /) -> Task | Any: ...
    def get(self, key: str, default: Any = None, /) -> Any:
        i = self._positions.get(key)
        if i is None:
            return default
        return self._chunks[i >> _SHIFT][i & _MASK]

    def __contains__(self, key: object) -> bool:
        return key in self._positions

    def __len__(self) -> int:
        return len(self._positions)

    def __iter__(self) -> Iterator[str]:
        return iter(self._positions)

    def values(self) -> ValuesView[Task]:
        return _Values(self)

    def items(self) -> ItemsView[str, Task]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def at(self, position: int) -> Task:
        """The task at ``position`` in the plan's order (from 0)."""
        return self._chunks[position >> _SHIFT][position & _MASK]

    def changes_since(self, older: TaskTable) -> Iterator[tuple[int, Task]] | None:
        """The positions and tasks of this table that are not ``older``'s.

        Found by the chunks the two tables do not share, so a table made
        from ``older`` by a few replacements is compared in a 64th of its
        length. None when this table was not made from ``older`` by
        replacing tasks alone (tasks added give the table new positions).
        """
        if self._positions is not older._positions:
            return None
        return self._changed(older._chunks)

    def _changed(self, before: list[list[Task]]) -> Iterator[tuple[int, Task]]:
        for c, chunk in enumerate(self._chunks):
            old = before[c]
            if chunk is not old:
                base = c << _SHIFT
                for j, task in enumerate(chunk):
                    if task is not old[j]:
                        yield base + j, task

    def replaced(self, changed: Mapping[str, Task]) -> TaskTable:
        """A copy with the tasks in ``changed`` in place of those with their
        ids (each already in the table)."""
        chunks = list(self._chunks)
        copied: set[int] = set()
        for key, task in changed.items():
            i = self._positions[key]
            c = i >> _SHIFT
            if c not in copied:
                chunks[c] = list(chunks[c])
                copied.add(c)
            chunks[c][i & _MASK] = task
        return TaskTable(self._positions, chunks)

    def added(self, tasks: Sequence[Task]) -> TaskTable:
        """A copy with ``tasks`` (new ids) at the end."""
        if not tasks:
            return self
        positions = dict(self._positions)
        chunks = list(self._chunks)
        count = len(positions)
        for task in tasks:
            if task.id in positions:
                raise ValueError(f"task {task.id} already exists")
            positions[task.id] = count
            c, j = count >> _SHIFT, count & _MASK
            if j == 0:
                chunks.append([task])
            else:
                if c < len(self._chunks) and chunks[c] is self._chunks[c]:
                    chunks[c] = list(chunks[c])  # shared: copied before adding
                chunks[c].append(task)
            count += 1
        return TaskTable(positions, chunks)


class _Values(ValuesView[Task]):
    __slots__ = ()
    _mapping: TaskTable

    def __iter__(self) -> Iterator[Task]:
        return chain.from_iterable(self._mapping._chunks)


class _Items(ItemsView[str, Task]):
    __slots__ = ()
    _mapping: TaskTable

    def __iter__(self) -> Iterator[tuple[str, Task]]:
        table = self._mapping
        return zip(table._positions, chain.from_iterable(table._chunks), strict=True)


def with_task(tasks: Mapping[str, Task], task: Task) -> Mapping[str, Task]:
    """``tasks`` with ``task`` in place of the one with its id (in the
    table); ``tasks`` itself is not changed. :func:`with_tasks` for one
    task, once or twice per event."""
    if type(tasks) is dict:
        out = tasks.copy()
        out[task.id] = task
        return out
    assert isinstance(tasks, TaskTable)
    return tasks.replaced({task.id: task})


def with_tasks(
    tasks: Mapping[str, Task],
    changed: Mapping[str, Task],
    added: Sequence[Task] = (),
) -> Mapping[str, Task]:
    """``tasks`` with the tasks in ``changed`` replaced and ``added`` at the
    end; ``tasks`` itself is not changed.

    Raises:
        ValueError: an added task's id is in the table already.
    """
    # By its class: isinstance() on a dict would go through the Mapping ABC.
    if type(tasks) is TaskTable:
        return tasks.replaced(changed).added(added)
    out = dict(tasks)
    out.update(changed)
    for task in added:
        if task.id in out:
            raise ValueError(f"task {task.id} already exists")
        out[task.id] = task
    if len(out) > SMALL:
        return TaskTable.of(out.values())
    return out


class IdLog(Sequence[str]):
    """Ids in the order they came, for lists too long to copy per event.

    Full chunks of :data:`CHUNK` ids are shared between versions; adding an
    id copies the last, partial one (and, once it is full, the list of
    chunks). Equal to any sequence of the same ids.
    """

    __slots__ = ("_full", "_tail")

    def __init__(
        self, full: tuple[tuple[str, ...], ...], tail: tuple[str, ...]
    ) -> None:
        self._full = full
        self._tail = tail

    @classmethod
    def of(cls, ids: Iterable[str]) -> IdLog:
        items = tuple(ids)
        cut = len(items) - len(items) % CHUNK
        full = tuple(items[i : i + CHUNK] for i in range(0, cut, CHUNK))
        return cls(full, items[cut:])

    def appended(self, item: str) -> IdLog:
        tail = (*self._tail, item)
        if len(tail) == CHUNK:
            return IdLog((*self._full, tail), ())
        return IdLog(self._full, tail)

    def __len__(self) -> int:
        return len(self._full) * CHUNK + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return list(self)[index]
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("IdLog index out of range")
        c, j = divmod(index, CHUNK)
        return self._tail[j] if c == len(self._full) else self._full[c][j]

    def __iter__(self) -> Iterator[str]:
        return chain(chain.from_iterable(self._full), self._tail)

    def __reversed__(self) -> Iterator[str]:
        return chain(
            reversed(self._tail),
            chain.from_iterable(reversed(chunk) for chunk in reversed(self._full)),
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdLog | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


def with_id(ids: Sequence[str], item: str) -> Sequence[str]:
    """``ids`` with ``item`` at the end; ``ids`` itself is not changed."""
    if len(ids) < SMALL:
        return [*ids, item]
    if isinstance(ids, IdLog):
        return ids.appended(item)
    return IdLog.of(ids).appended(item)
