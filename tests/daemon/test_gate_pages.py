"""``GET /v1/gates`` in pages, as ``GET /v1/runs`` is, and ``replan gates``
over every page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from in_process import serving

from replan import _remote
from replan._demo import GOAL, demo_model
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon

TOKEN = "gate-pages-test-token"


def gated_daemon(tmp_path: Path) -> Daemon:
    return Daemon(
        settings=DaemonSettings(data_dir=tmp_path),
        token=Token(TOKEN),
        model=demo_model(),
    )


async def five_runs_at_their_gates(daemon: Daemon, client: httpx.AsyncClient) -> None:
    """Submit five demo runs and wait until each waits at its gate."""
    for _ in range(5):
        response = await client.post("/v1/runs", json={"goal": GOAL})
        assert response.status_code == 202
    with anyio.fail_after(10):
        while True:
            if len(daemon.supervisor.gates.pending()) == 5:
                break
            await anyio.sleep(0.01)


async def test_open_gates_are_listed_oldest_first_in_pages(tmp_path: Path) -> None:
    daemon = gated_daemon(tmp_path)
    async with serving(daemon) as client:
        await five_runs_at_their_gates(daemon, client)
        whole = (await client.get("/v1/gates", params={"limit": 1000})).json()
        pages = [
            (await client.get("/v1/gates", params={"limit": 2, "offset": o})).json()
            for o in (0, 2, 4)
        ]
        default = (await client.get("/v1/gates")).json()
        too_many = await client.get("/v1/gates", params={"limit": 1001})
        for run in (await client.get("/v1/runs")).json()["runs"]:
            await client.post(f"/v1/runs/{run['run_id']}/cancel")

    ids = [g["gate_id"] for g in whole["gates"]]
    assert len(ids) == 5
    assert [g["gate_id"] for page in pages for g in page["gates"]] == ids
    assert [page["next_offset"] for page in pages] == [2, 4, None]
    assert (default["limit"], default["offset"], default["next_offset"]) == (
        50,
        0,
        None,
    )
    assert too_many.status_code == 422
    assert too_many.json()["field"] == "limit"


async def test_a_gate_answered_between_two_pages_skips_none_paged_by_cursor(
    tmp_path: Path,
) -> None:
    # Paged by offset, the gates after one answered meanwhile moved a place
    # up, and the next page started one gate too far.
    daemon = gated_daemon(tmp_path)
    async with serving(daemon) as client:
        await five_runs_at_their_gates(daemon, client)
        whole = [g["gate_id"] for g in (await client.get("/v1/gates")).json()["gates"]]
        first = (await client.get("/v1/gates", params={"limit": 2})).json()
        # The person answers the first gate of the page (its run ends).
        answered = first["gates"][0]
        cancel = await client.post(f"/v1/runs/{answered['run_id']}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert answered["gate_id"] not in [
            g.gate_id for g in daemon.supervisor.gates.pending()
        ]
        params = {"limit": 2, "cursor": first["next_cursor"]}
        second = (await client.get("/v1/gates", params=params)).json()
        params = {"limit": 2, "cursor": second["next_cursor"]}
        third = (await client.get("/v1/gates", params=params)).json()
        by_offset = (
            await client.get("/v1/gates", params={"limit": 2, "offset": 2})
        ).json()
        bad = await client.get("/v1/gates", params={"cursor": "g1"})
        both = await client.get(
            "/v1/gates", params={"cursor": first["next_cursor"], "offset": 2}
        )
        for run in (await client.get("/v1/runs")).json()["runs"]:
            await client.post(f"/v1/runs/{run['run_id']}/cancel")

    listed = [g["gate_id"] for p in (first, second, third) for g in p["gates"]]
    assert listed == whole
    assert third["next_cursor"] is None
    assert third["next_offset"] is None
    # What the offset gave: the fourth gate, the third skipped.
    assert [g["gate_id"] for g in by_offset["gates"]] == whole[3:5]
    assert bad.status_code == 422
    assert bad.json()["field"] == "cursor"
    assert both.status_code == 422
    assert both.json()["field"] == "offset"


class _GatePages:
    """A daemon with these open gates, 2 to a page whatever the limit."""

    def __init__(self, gate_ids: list[str], paged: bool = True) -> None:
        self.gate_ids = gate_ids
        self.paged = paged
        self.asked: list[dict[str, Any]] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        assert (method, path) == ("GET", "/v1/gates")
        params = kwargs.get("params", {})
        self.asked.append(params)
        if not self.paged:  # a daemon from before pages
            return {"gates": [{"gate_id": g} for g in self.gate_ids]}
        offset = params.get("offset", 0)  # a daemon from before cursors
        more = offset + 2 < len(self.gate_ids)
        return {
            "gates": [{"gate_id": g} for g in self.gate_ids[offset : offset + 2]],
            "elsewhere": {"r3-g1": "host:7"},
            "next_offset": offset + 2 if more else None,
        }


@pytest.mark.parametrize("paged", [True, False])
def test_every_page_of_gates_is_read(paged: bool) -> None:
    daemon = _GatePages(["r1-g1", "r2-g1", "r3-g1", "r4-g2", "r5-g1"], paged)

    listed = list(_remote._open_gates(daemon, "r"))  # type: ignore[arg-type]

    assert [g["gate_id"] for g, _ in listed] == daemon.gate_ids
    assert len(daemon.asked) == (3 if paged else 1)
    assert {p["run_id"] for p in daemon.asked} == {"r"}
    if paged:
        assert [holder for _, holder in listed] == [None, None, "host:7", None, None]
    # approve g2 finds the one gate named so on the last page.
    assert _remote._find_gate(daemon, "g2") == "r4-g2"  # type: ignore[arg-type]


class _AnsweredMeanwhile:
    """A daemon paging by cursor, 2 to a page, whose first gate is answered
    once the first page has been read."""

    def __init__(self, gate_ids: list[str]) -> None:
        self.open = list(gate_ids)
        self.order = list(gate_ids)
        self.asked: list[dict[str, Any]] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        params = kwargs.get("params", {})
        self.asked.append(params)
        start = 0
        if "cursor" in params:
            start = self.order.index(params["cursor"]) + 1
        after = [g for g in self.order[start:] if g in self.open]
        page, more = after[:2], len(after) > 2
        if len(self.asked) == 1:
            self.open.remove(self.order[0])
        return {
            "gates": [{"gate_id": g} for g in page],
            "next_offset": start + 2 if more else None,
            "next_cursor": page[-1] if more else None,
        }


def test_replan_gates_skips_no_gate_when_one_is_answered_between_pages() -> None:
    daemon = _AnsweredMeanwhile(["r1-g1", "r2-g1", "r3-g1", "r4-g1", "r5-g1"])

    listed = [g["gate_id"] for g, _ in _remote._open_gates(daemon)]  # type: ignore[arg-type]

    assert listed == daemon.order
    assert [set(p) - {"limit"} for p in daemon.asked] == [set(), {"cursor"}, {"cursor"}]
