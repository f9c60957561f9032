"""Reading a finished span tree: by name, by parent, by trace."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from replan import MemoryStore, RunResult, RunSpec, ScriptedModel, Supervisor
from replan.telemetry import _names as n


async def until(check: Callable[[], object]) -> None:
    """Poll ``check`` until it holds (the run gives no event to wait on)."""
    with anyio.fail_after(5):
        while True:
            if check():
                return
            await anyio.sleep(0.005)


async def run_traced(
    model: ScriptedModel,
    run_spec: RunSpec,
    provider: TracerProvider,
    meter_provider: MeterProvider | None = None,
) -> RunResult:
    """Run ``run_spec`` to its end under a supervisor with these providers."""
    with anyio.fail_after(10):
        async with Supervisor(
            model,
            MemoryStore(),
            tracer_provider=provider,
            meter_provider=meter_provider,
        ) as sup:
            handle = await sup.submit(run_spec)
            return await handle.result()


@dataclass(frozen=True)
class Tree:
    spans: Sequence[ReadableSpan]

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}"
        return found[0]

    def by_id(self, span_id: int) -> ReadableSpan:
        for span in self.spans:
            if span.context is not None and span.context.span_id == span_id:
                return span
        raise KeyError(hex(span_id))

    def parent(self, span: ReadableSpan) -> ReadableSpan | None:
        if span.parent is None:
            return None
        return self.by_id(span.parent.span_id)

    def children(
        self, span: ReadableSpan, name: str | None = None
    ) -> list[ReadableSpan]:
        assert span.context is not None
        return [
            s
            for s in self.spans
            if s.parent is not None
            and s.parent.span_id == span.context.span_id
            and (name is None or s.name == name)
        ]

    def of_run(self, run_id: str) -> Tree:
        return Tree(
            [
                s
                for s in self.spans
                if (s.attributes or {}).get(n.GEN_AI_CONVERSATION_ID) == run_id
            ]
        )

    def traces(self) -> set[int]:
        return {s.context.trace_id for s in self.spans if s.context is not None}


def attr(span: ReadableSpan, key: str) -> Any:
    attributes = span.attributes or {}
    assert key in attributes, f"{span.name} has no {key}: {dict(attributes)}"
    return attributes[key]
