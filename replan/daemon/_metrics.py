"""``/metrics``: the supervisor's own counters in Prometheus text format.

A dozen gauges and counters need no client library: each line is
``name{labels} value`` under ``# HELP`` and ``# TYPE`` comments (text
exposition format 0.0.4).
"""

from __future__ import annotations

from collections import Counter

from ..messages import RunStatus
from ._service import Daemon

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(daemon: Daemon) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    sup = daemon._supervisor
    handles = sup.handles() if sup is not None else []
    by_status = Counter(h.status for h in handles)
    family(
        "replan_runs", "gauge", "Runs this daemon process holds in memory, by status."
    )
    lines.extend(
        f'replan_runs{{status="{status.value}"}} {by_status[status]}'
        for status in RunStatus
    )
    totals = sup.totals() if sup is not None else None
    family(
        "replan_runs_ended_total",
        "counter",
        "Runs this daemon process drove to their end, by final status.",
    )
    ended = totals.runs_ended if totals else {}
    lines.extend(
        f'replan_runs_ended_total{{status="{status.value}"}} '
        f"{ended.get(status.value, 0)}"
        for status in RunStatus
        if status.final
    )
    family(
        "replan_replans_total",
        "counter",
        "Replan decisions of this daemon process's runs, by trigger and outcome.",
    )
    lines.extend(
        f'replan_replans_total{{trigger="{trigger}",outcome="{outcome}"}} {count}'
        for (trigger, outcome), count in sorted(
            (totals.replans if totals else {}).items()
        )
    )
    family(
        "replan_tokens_total",
        "counter",
        "Model tokens of this daemon process's runs, by role and type.",
    )
    lines.extend(
        f'replan_tokens_total{{role="{role}",type="{kind}"}} {count}'
        for (role, kind), count in sorted((totals.tokens if totals else {}).items())
    )
    family("replan_runs_submitted_total", "counter", "Runs accepted over HTTP.")
    lines.append(f"replan_runs_submitted_total {daemon.counters.submitted}")
    family(
        "replan_runs_refused_total",
        "counter",
        "Submissions refused with 429: max_active_runs were unfinished.",
    )
    lines.append(f"replan_runs_refused_total {daemon.counters.refused}")
    family("replan_gates_pending", "gauge", "Human gates waiting for an answer.")
    lines.append(f"replan_gates_pending {len(sup.gates.pending()) if sup else 0}")
    family("replan_event_streams", "gauge", "Open event streams (SSE).")
    lines.append(f"replan_event_streams {daemon.counters.streams_open}")
    family(
        "replan_retention_runs_total", "counter", "Finished runs compacted or deleted."
    )
    lines.append(
        f'replan_retention_runs_total{{action="compact"}} {daemon.counters.compacted}'
    )
    lines.append(
        f'replan_retention_runs_total{{action="delete"}} {daemon.counters.deleted}'
    )
    stats = sup.pool_statistics() if sup is not None else []
    for name, kind, help_text, value in (
        ("replan_actor_workers", "gauge", "Workers per actor role.", "workers"),
        (
            "replan_actor_busy",
            "gauge",
            "Workers handling a request, those waiting for a person aside.",
            "busy",
        ),
        (
            "replan_actor_waiting_for_people",
            "gauge",
            "Workers whose request waits for a person (a tool call's approval).",
            "waiting_for_people",
        ),
        (
            "replan_actor_mailbox_depth",
            "gauge",
            "Requests waiting in a role's mailbox.",
            "mailbox_depth",
        ),
        (
            "replan_actor_restarts_total",
            "counter",
            "Workers replaced after a crash.",
            "restarts",
        ),
    ):
        family(name, kind, help_text)
        lines.extend(
            f'{name}{{role="{pool.role}"}} {getattr(pool, value)}' for pool in stats
        )
    family("replan_ready", "gauge", "1 while the daemon accepts runs.")
    lines.append(f"replan_ready {int(daemon.ready)}")
    return "\n".join(lines) + "\n"
