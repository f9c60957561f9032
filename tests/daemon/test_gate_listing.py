"""The gate listing folds a run driven elsewhere from its journal once, and
then only what the journal gained since."""

from __future__ import annotations

from pathlib import Path

import anyio

from replan import RunStatus, Supervisor
from replan._demo import demo_model, demo_spec
from replan.daemon import DaemonSettings, Token
from replan.daemon._service import Daemon
from replan.messages import Event, GateOpened
from replan.store import MemoryStore
from replan.supervisor import fold_journal


class Reads(MemoryStore):
    """A journal that notes every read: the run and where it started."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, int]] = []

    async def read(self, run_id: str, after: int = 0) -> list[Event]:
        self.reads.append((run_id, after))
        return await super().read(run_id, after)


async def test_a_run_is_read_again_only_from_where_it_was_folded(
    tmp_path: Path,
) -> None:
    store = Reads()
    daemon = Daemon(
        settings=DaemonSettings(data_dir=tmp_path),
        token=Token("gate-listing-token-0123"),
        model=demo_model(),
    )
    daemon._store = store  # as the daemon's journal, without serving
    with anyio.fail_after(30):
        async with Supervisor(model=demo_model(), store=store) as sup:
            handle = await sup.submit(demo_spec())
            async for event in handle.events():
                if isinstance(event, GateOpened):
                    break
            run_id = handle.run_id
            waiting = await store.get_run(run_id)
            assert waiting is not None
            store.reads.clear()

            first = await daemon._journal_state(run_id, waiting.last_seq)
            assert store.reads == [(run_id, 0)]
            assert [g.request.gate_id for g in first.open_gates]
            # Nothing new in the journal: nothing read.
            again = await daemon._journal_state(run_id, waiting.last_seq)
            assert again is first
            assert store.reads == [(run_id, 0)]

            (gate,) = sup.gates.pending(run_id)
            await sup.gates.resolve(gate.gate_id, {"decision": "approve", "by": "ana"})
            await handle.result()
            ended = await store.get_run(run_id)
            assert ended is not None
            assert ended.last_seq > waiting.last_seq
            store.reads.clear()
            latest = await daemon._journal_state(run_id, ended.last_seq)
            assert store.reads == [(run_id, waiting.last_seq)]
            whole = fold_journal(run_id, await store.read(run_id))
    assert latest == whole
    assert latest.status is RunStatus.COMPLETED
