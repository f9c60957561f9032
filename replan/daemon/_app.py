"""The HTTP API: an ASGI app over one :class:`Daemon`.

Every ``/v1`` route needs ``Authorization: Bearer <token>`` (401 without,
403 with a wrong one), checked before the request is routed or its body
read. Bad input is answered 4xx with a :class:`Problem` naming the field;
nothing a client sends produces a 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, NoReturn

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPBearer
from opentelemetry import trace
from starlette.exceptions import HTTPException

from .._errors import (
    ConfigurationError,
    GateAlreadyResolved,
    GateError,
    JournalConflict,
    JournalCorrupt,
    JournalUnavailable,
    ReplanError,
    ResolutionRefused,
    RunDrivenElsewhere,
    SupervisorError,
    UnknownRunError,
)
from .._version import __version__
from ..messages import GateResolution, Limits, RunSpec, RunStatus
from ..store import RunLeases
from ..supervisor import RunState
from ..supervisor._forwarding import gate_of
from ..supervisor._gates import already_resolved
from ..supervisor._state import RUN_ENDED_NOTE
from ..telemetry import _names as n
from ._auth import BearerAuth
from ._forwarded import (
    CancelForwarded,
    GateForwarded,
    cancel_forwarded,
    gate_forwarded,
)
from ._gate_pages import gate_page
from ._idempotency import (
    HEADER,
    KeyedSubmissions,
    differences,
    key_problem,
    run_id_of,
)
from ._json import StrictJsonRoute
from ._limits import BodyLimit
from ._metrics import CONTENT_TYPE, render_metrics
from ._outage import handle_journal_outages
from ._schemas import (
    Accepted,
    Cancelled,
    GateAnswered,
    GateList,
    Problem,
    RunPage,
    RunView,
    VersionList,
)
from ._service import Daemon
from ._sse import EventStream
from ._tracing import ServerSpans, without_framework_spans

logger = logging.getLogger("replan.daemon")

# Declares the scheme in the OpenAPI document only: BearerAuth checks it.
_bearer = HTTPBearer(auto_error=False, description="REPLAN_API_TOKEN")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem} for code in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}


MAX_SEQ = 1_000_000_000
"""The largest event seq a client may resume after (SQLite needs < 2**63)."""

RunId = Annotated[str, Path(min_length=1, max_length=200)]
GateId = Annotated[str, Path(min_length=1, max_length=220)]


class ApiError(HTTPException):
    """An error answer with the field it is about."""

    def __init__(
        self,
        status: int,
        detail: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, detail, headers)
        self.field = field


STARTING = (
    "the daemon is starting (it resumes the journal's unfinished runs): "
    "try again in a few seconds"
)
DRAINING = (
    "the daemon is shutting down (it drains its runs for a restart): try "
    "again once it has restarted"
)
_RETRY = {"Retry-After": "5"}


def _starting(daemon: Daemon) -> bool:
    """The daemon has not served yet: its journal's runs are resuming."""
    return daemon._supervisor is None and not daemon.draining


def _not_serving(daemon: Daemon, exc: SupervisorError) -> tuple[str, dict[str, str]]:
    """Why the supervisor refused a request (``exc``), and the headers of
    the 503: during a start or a drain the request was refused before it
    changed anything, so it is worth sending again (``Retry-After``)."""
    if _starting(daemon):
        return STARTING, _RETRY
    if daemon.draining:
        return DRAINING, _RETRY
    return str(exc), {}


OUTAGE_GRACE_S = 3.0
"""How long a write or a read waits for a journal known to be out of
reach before its 503: longer than the store waits between two tries (2 s at most, and
the daemon uses its journal every 0.5 s), so a server that is back again
is seen; far shorter than the store's ``reconnect_s``."""
_OUTAGE_LOOK_S = 0.1


async def _refuse_in_outage(
    daemon: Daemon, refusal: str, *, wrote: bool = True
) -> None:
    """Answer 503 with ``Retry-After`` within :data:`OUTAGE_GRACE_S` while
    the journal's server is known to be out of reach: its calls would wait
    for it up to ``reconnect_s`` (30 s), longer than many clients wait for
    an answer. The request has changed nothing, and is worth sending again.
    ``wrote`` is False for a read, whose detail then says no more than that.

    Raises:
        ApiError: the journal cannot be reached.
    """
    # The store says when it reaches the server again; nothing to wait on.
    for _ in range(round(OUTAGE_GRACE_S / _OUTAGE_LOOK_S)):
        if daemon.journal_outage is None:
            return
        await anyio.sleep(_OUTAGE_LOOK_S)
    outage = daemon.journal_outage
    if outage is not None:
        again = "nothing was written; " if wrote else ""
        raise ApiError(
            503,
            f"{refusal}: the journal cannot be reached for now ({again}send "
            f"the request again): {outage}",
            headers=_RETRY,
        )


QUERY_PARAMETERS = frozenset({"status", "limit", "offset", "after", "run_id", "cursor"})
"""Every query parameter an endpoint takes (see :class:`KnownQuery`)."""


def create_app(daemon: Daemon, *, start: bool = True) -> FastAPI:
    """The ASGI app; its lifespan runs ``daemon.running()``, unless ``start``
    is false: whoever serves the app runs the daemon beside it, as ``replan
    serve`` does so that the API answers while the journal's runs resume
    (503 with ``Retry-After`` until they have)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not start:
            yield
            return
        async with daemon.running():
            yield

    app = FastAPI(
        title="replan",
        version=__version__,
        summary="Durable replanning runs with human gates.",
        lifespan=lifespan,
        responses=_ERRORS,
        **without_framework_spans(),
    )
    app.add_middleware(BodyLimit, max_bytes=daemon.settings.max_body_bytes)
    # Added last, so it runs first: no body is read for a caller without a token.
    app.add_middleware(BearerAuth, token=daemon.token)
    # Outermost: 401, 403 and 413 answers get their SERVER span too.
    app.add_middleware(ServerSpans, tracer_provider=daemon.tracer_provider)
    _handle_errors(app, daemon)
    handle_journal_outages(app, daemon)
    app.include_router(_v1(daemon))

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses={503: {"model": Problem}})
    async def readyz() -> dict[str, str]:
        """The daemon accepts runs (not starting, not draining, its journal
        reached)."""
        if _starting(daemon):
            raise ApiError(503, f"not ready: {STARTING}", headers=_RETRY)
        if not daemon.ready:
            raise ApiError(503, "not ready: the daemon is shutting down")
        outage = daemon.journal_outage
        if outage is not None:
            raise ApiError(
                503,
                f"not ready: the journal cannot be reached (its runs wait for "
                f"it): {outage}",
                headers=_RETRY,
            )
        return {"status": "ready"}

    # HEAD too, as `curl -I` and some load balancers' checks ask (the server
    # sends no body); the schema lists the GET alone.
    for path, check in (("/healthz", healthz), ("/readyz", readyz)):
        app.add_api_route(path, check, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format."""
        return PlainTextResponse(render_metrics(daemon), media_type=CONTENT_TYPE)

    return app


def _v1(daemon: Daemon) -> APIRouter:
    router = APIRouter(
        prefix="/v1",
        dependencies=[Depends(_bearer)],
        tags=["v1"],
        route_class=StrictJsonRoute,
    )

    keyed = KeyedSubmissions()

    @router.post(
        "/runs",
        status_code=202,
        response_model=Accepted,
        responses={200: {"model": Accepted, "description": "Accepted before"}},
    )
    async def submit(
        spec: RunSpec,
        idempotency_key: Annotated[
            str | None,
            Header(
                description="Any string up to 255 characters: the same key "
                "with the same spec gets the run it started (200), never a "
                "second run, also after a restart; with another spec, 422."
            ),
        ] = None,
    ) -> JSONResponse:
        """Start a run; follow the returned ``url``."""
        await _refuse_in_outage(daemon, "not accepting runs")
        if idempotency_key is None:
            return await _start_run(spec)
        key = idempotency_key.strip()
        problem = key_problem(key)
        if problem is not None:
            raise ApiError(400, problem, "idempotency-key")
        run_id = run_id_of(key)
        async with keyed.holding(run_id):
            state = await _keyed_run(run_id)
            if state is None:
                try:
                    return await _start_run(spec, run_id)
                except JournalConflict:
                    # Another daemon on the shared journal journaled the
                    # same key's run first, after the look above.
                    state = await _keyed_run(run_id)
                    if state is None:
                        raise
        differ = differences(state.spec, spec)
        if differ:
            raise ApiError(
                422,
                f"{HEADER}: the key started run {run_id} with another spec "
                f"(it differs in {', '.join(differ)}): a new run needs a new key",
                "idempotency-key",
            )
        return _accepted(run_id, state.status, 200)

    async def _keyed_run(run_id: str) -> RunState | None:
        """The state of the run an idempotency key names, if it exists."""
        try:
            state: RunState = await daemon.run_state(run_id)
        except UnknownRunError:
            return None
        except ReplanError:
            raise  # not serving yet (503), a damaged journal (409)
        except Exception as exc:
            logger.warning("cannot look up run %s: %s", run_id, exc)
            raise ApiError(
                503,
                f"cannot look up run {run_id}, which {HEADER} names: the "
                "journal cannot be read; send the request again",
                headers=_RETRY,
            ) from None
        return state

    async def _start_run(spec: RunSpec, run_id: str | None = None) -> JSONResponse:
        try:
            supervisor = daemon.supervisor
            # Submissions still on their way into the journal count too: a
            # submit may wait for other runs' appends (group commit), and
            # requests that arrive meanwhile must not all see a free place.
            active = daemon.submitting + sum(
                not h.status.final for h in supervisor.handles()
            )
            if active >= daemon.settings.max_active_runs:
                daemon.counters.refused += 1
                raise ApiError(
                    429,
                    f"{active} runs are unfinished, the daemon's max_active_runs: "
                    "try again once some have ended",
                    headers={"Retry-After": "5"},
                )
            spec = _with_default_limits(spec, daemon.settings.default_limits)
            daemon.submitting += 1
            try:
                handle = await supervisor.submit(spec, run_id=run_id)
            finally:
                daemon.submitting -= 1
        except ConfigurationError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        except SupervisorError as exc:
            if daemon.draining:
                # Worth another try: the daemon is draining for a restart.
                raise ApiError(
                    503,
                    "not accepting runs: the daemon is shutting down; submit the "
                    "run again once it has restarted",
                    headers={"Retry-After": "5"},
                ) from None
            if _starting(daemon):
                raise ApiError(
                    503, f"not accepting runs yet: {STARTING}", headers=_RETRY
                ) from None
            raise ApiError(503, f"not accepting runs: {exc}") from None
        except JournalUnavailable as exc:
            # A full disk, a lost database connection: worth another try once
            # the journal takes writes again (the detail names the run to
            # look up first, in case its write went through).
            logger.warning("a run could not be journaled: %s", exc)
            raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
        daemon.counters.submitted += 1
        return _accepted(handle.run_id, handle.status, 202)

    @router.get("/runs", response_model=RunPage)
    async def list_runs(
        status: Annotated[list[RunStatus] | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    ) -> RunPage:
        """Runs newest first, optionally only those with the given statuses."""
        await _refuse_in_outage(daemon, "not reading runs", wrote=False)
        rows = await daemon.store.list_runs(
            statuses=status or None, limit=limit + 1, offset=offset
        )
        more = len(rows) > limit
        return RunPage(
            runs=rows[:limit],
            limit=limit,
            offset=offset,
            next_offset=offset + limit if more else None,
        )

    @router.get("/runs/{run_id}", response_model=RunView)
    async def get_run(run_id: RunId) -> RunView:
        """A run's status, tasks, usage, stop reason and gates."""
        await _refuse_in_outage(daemon, "not reading runs", wrote=False)
        state = await _state(daemon, run_id)
        return RunView(
            run_id=state.run_id,
            status=state.status,
            created_at=state.created_at,
            updated_at=state.updated_at,
            last_seq=state.seq,
            total_usage=state.usage.total,
            result=state.result(),
            gates=list(state.gates.values()),
            side_effects=await daemon.side_effects(state),
        )

    @router.get("/runs/{run_id}/versions", response_model=VersionList)
    async def versions(run_id: RunId) -> VersionList:
        """Every applied plan version with its diff (removed, added, preserved)."""
        await _refuse_in_outage(daemon, "not reading runs", wrote=False)
        state = await _state(daemon, run_id)
        return VersionList(run_id=run_id, versions=state.versions)

    @router.get(
        "/runs/{run_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def events(
        run_id: RunId,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
        last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
    ) -> StreamingResponse:
        """The run's events as Server-Sent Events: history, then live.

        Resume with ``Last-Event-ID`` (or ``?after=SEQ``). A stream opened
        while the journal is known to be out of reach gets the reads' 503;
        one open already keeps its heartbeats while it waits for the journal.
        """
        if last_event_id is not None:
            after = _last_event_id(last_event_id)
        # Before the run is looked up, which would wait for the journal up to
        # its reconnect_s.
        await _refuse_in_outage(daemon, "not streaming events", wrote=False)
        await _state(daemon, run_id)  # 404 before the stream starts
        return EventStream(daemon, run_id, after)

    @router.post(
        "/runs/{run_id}/cancel",
        response_model=Cancelled,
        responses={202: {"model": CancelForwarded}},
    )
    async def cancel(run_id: RunId) -> Any:
        """Cancel a run; it ends ``cancelled`` (409 if it already ended).

        200 only once the run has ended; 409 when it cannot end here (its
        driver stopped), 503 while the daemon shuts down. On a shared
        PostgreSQL journal, the cancel of a run another daemon drives (or
        none does at the moment) goes to it: 202, saying whether it was
        applied already.
        """
        await _refuse_in_outage(daemon, "not cancelling runs")
        state = await _state(daemon, run_id)
        if state.status.final:
            raise ApiError(409, f"run {run_id} already ended {state.status.value}")
        try:
            sup = daemon.supervisor
        except SupervisorError as exc:  # starting or shutting down
            detail, headers = _not_serving(daemon, exc)
            raise ApiError(
                503, f"not cancelling runs: {detail}", headers=headers or None
            ) from None
        try:
            sent = await sup.cancel(run_id)
        except (UnknownRunError, RunDrivenElsewhere):
            # Deleted meanwhile (retention, once the cancel ended it): 404.
            await _state(daemon, run_id)
            raise ApiError(409, await _not_here(daemon, run_id)) from None
        except SupervisorError as exc:
            status = 409 if daemon.ready else 503
            raise ApiError(status, str(exc)) from None
        # Retention may delete the run once it ended: a 404, as for any run.
        final = await _state(daemon, run_id)
        # The run may have ended on its own after the look above, before the
        # cancel reached it: that is the 409 of a run that ended, not a 200.
        if final.status.final and final.status is not RunStatus.CANCELLED:
            raise ApiError(409, f"run {run_id} already ended {final.status.value}")
        ended = Cancelled(
            run_id=run_id, status=final.status, stop_reason=final.stop_reason
        )
        if sent is None:
            return ended
        applied = final.status is RunStatus.CANCELLED
        body = cancel_forwarded(sent, ended, applied=applied)
        return JSONResponse(body.model_dump(mode="json"), status_code=202)

    @router.get("/gates", response_model=GateList)
    async def gates(
        run_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
        cursor: Annotated[str | None, Query(min_length=1, max_length=300)] = None,
    ) -> GateList:
        """Gates waiting for a person, oldest first (by when each opened,
        then id), in pages: the next one starts after ``next_cursor``, which
        no gate answered meanwhile moves (``next_offset`` does).

        On a shared PostgreSQL journal, every open gate of the journal;
        ``elsewhere`` names the daemon that drives the run of each one open
        in another daemon (of those on the page).
        """
        if cursor is not None and offset:
            raise ApiError(422, "give cursor or offset, not both", "offset")
        await _refuse_in_outage(daemon, "not listing gates", wrote=False)
        found, elsewhere = await daemon.open_gates(run_id)
        if run_id is not None and not found and not await _exists(daemon, run_id):
            # A mistyped id is not a run with nothing to answer.
            raise ApiError(404, f"no run {run_id}", "run_id")
        try:
            page = gate_page(found, limit, offset, cursor)
        except ValueError as exc:
            raise ApiError(422, str(exc), "cursor") from None
        return GateList(
            gates=page.gates,
            elsewhere={
                g.gate_id: elsewhere[g.gate_id]
                for g in page.gates
                if g.gate_id in elsewhere
            },
            limit=limit,
            offset=offset,
            next_offset=page.next_offset,
            next_cursor=page.next_cursor,
        )

    @router.post(
        "/gates/{gate_id}",
        response_model=GateAnswered,
        responses={202: {"model": GateForwarded}},
    )
    async def resolve(
        gate_id: GateId,
        resolution: GateResolution,
    ) -> Any:
        """Approve, reject, or edit (with tasks) a gate's proposed change.

        200 once the answer is journaled. On a shared PostgreSQL journal,
        an answer to a gate of a run another daemon drives (or none does at
        the moment) is checked here, then goes to it: 202, saying whether
        it was applied already.
        """
        await _refuse_in_outage(daemon, "not answering gates")
        sup = daemon.supervisor
        request = sup.gates.get(gate_id)
        try:
            sent = await sup.gates.resolve(gate_id, resolution)
        except GateAlreadyResolved as exc:
            # Someone else's answer came first: the error names it. A gate
            # its run's end closed is told as such, as an unknown one is.
            if RUN_ENDED_NOTE in str(exc):
                await _closed_gate(daemon, gate_id)
            raise ApiError(409, str(exc)) from None
        except ResolutionRefused as exc:
            raise ApiError(422, str(exc), exc.field) from None
        except GateError:
            # No such gate open, or closed (its run ended) meanwhile.
            await _closed_gate(daemon, gate_id)
        if sent is not None:
            body = gate_forwarded(sent, gate_id, resolution)
            return JSONResponse(body.model_dump(mode="json"), status_code=202)
        run_id = request.run_id if request is not None else gate_of(gate_id)
        return GateAnswered(
            gate_id=gate_id, run_id=run_id or "", decision=resolution.decision
        )

    return router


def _accepted(run_id: str, status: RunStatus, code: int) -> JSONResponse:
    """The answer to a submission: 202 for a run it started, 200 for the
    run an earlier one with its idempotency key started."""
    # The request's SERVER span names the run.
    trace.get_current_span().set_attribute(n.GEN_AI_CONVERSATION_ID, run_id)
    url = f"/v1/runs/{run_id}"
    body = Accepted(run_id=run_id, url=url, status=status)
    return JSONResponse(
        body.model_dump(mode="json"), status_code=code, headers={"Location": url}
    )


async def _state(daemon: Daemon, run_id: str) -> Any:
    try:
        return await daemon.run_state(run_id)
    except UnknownRunError:
        raise ApiError(404, f"no run {run_id}", "run_id") from None


async def _exists(daemon: Daemon, run_id: str) -> bool:
    """Is there a run ``run_id``, live here or in the journal?"""
    try:
        daemon.supervisor.get(run_id)
    except UnknownRunError:
        return await daemon.store.get_run(run_id) is not None
    return True


async def _not_here(daemon: Daemon, run_id: str) -> str:
    """Why a run cannot be acted on here: another daemon drives it (named),
    or nobody does for now."""
    holder = await daemon.driven_elsewhere(run_id)
    if holder is not None:
        return f"run {run_id} is driven by another daemon ({holder}): cancel it there"
    if isinstance(daemon.store, RunLeases):
        return f"run {run_id} {_NOBODY}"
    return f"run {run_id} is not active here"


_NOBODY = (
    "is driven by no daemon at the moment (the one that drove it stopped): "
    "try again once a daemon takes it over, at its next look for runs to drive on"
)


async def _closed_gate(daemon: Daemon, gate_id: str) -> NoReturn:
    """404 for a gate that never existed, 409 for one no longer open.

    A gate closes when someone resolves it, or unresolved when its run ends
    (cancelled, failed, out of limits); the answer says which.
    """
    run_id, sep, _ = gate_id.rpartition("-g")
    if sep:
        try:
            state = await daemon.run_state(run_id)
        except UnknownRunError:
            pass
        else:
            info = state.gates.get(gate_id)
            closed_by_end = (
                info is not None
                and info.resolution is not None
                and info.resolution.by == "supervisor"
                and (info.resolution.note or "").startswith(RUN_ENDED_NOTE)
            )
            if info is not None and info.resolution is not None and not closed_by_end:
                raise ApiError(409, already_resolved(gate_id, info.resolution))
            if info is not None and state.status.final:
                raise ApiError(
                    409,
                    f"gate {gate_id} is closed: its run ended {state.status.value}",
                )
            if info is not None:
                holder = await daemon.driven_elsewhere(run_id)
                if holder is not None:
                    raise ApiError(
                        409,
                        f"gate {gate_id} is open in another daemon ({holder}), "
                        f"which drives run {run_id}: answer it there",
                    )
                if isinstance(daemon.store, RunLeases):
                    detail = f"gate {gate_id} is open, but its run {_NOBODY}"
                    raise ApiError(409, detail)
                raise ApiError(409, f"gate {gate_id} is not open in this daemon")
    raise ApiError(404, f"no gate {gate_id}", "gate_id")


def _last_event_id(value: str) -> int:
    """The seq a ``Last-Event-ID`` header names, bounded like ``?after=``."""
    text = value.strip()
    digits = text.isascii() and text.isdigit() and len(text) <= 20
    seq = int(text) if digits else -1
    if not 0 <= seq <= MAX_SEQ:
        raise ApiError(
            400,
            f"Last-Event-ID must be an event id (a seq from 0 to {MAX_SEQ})",
            "last-event-id",
        )
    return seq


def _with_default_limits(spec: RunSpec, defaults: Limits) -> RunSpec:
    """The daemon's default limits under the ones the spec sets itself."""
    if "limits" not in spec.model_fields_set:
        return spec.model_copy(update={"limits": defaults})
    given = spec.limits.model_dump(include=spec.limits.model_fields_set)
    merged = Limits.model_validate({**defaults.model_dump(), **given})
    return spec.model_copy(update={"limits": merged})


def _problem(status: int, detail: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(
        Problem(detail=detail, field=field).model_dump(), status_code=status
    )


def _field_of(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


def _unparsable_body(exc: HTTPException) -> str | None:
    """What made the body unreadable, when FastAPI could not decode it at all.

    FastAPI answers a body its request could not parse (not UTF-8, or
    refused by :class:`StrictJsonRequest`: a syntax error, a lone surrogate,
    too deep) with a bare 400 whose cause is the decoding error.
    """
    cause = exc.__cause__
    if isinstance(exc, ApiError) or exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return f"it is not UTF-8 ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "it is nested too deeply"
    return str(cause) or type(cause).__name__


async def _at_explore_review(daemon: Daemon, request: Request) -> bool:
    """Does the request answer an explore review (which takes hypotheses,
    where a plan's gate takes tasks)? Open here, or, for a run another
    daemon drives, in the run's journal."""
    gate_id = request.path_params.get("gate_id")
    if not isinstance(gate_id, str) or not daemon.ready:
        return False
    gate = daemon.supervisor.gates.get(gate_id)
    if gate is not None:
        return gate.hypotheses is not None
    run_id = gate_of(gate_id)
    if not run_id:
        return False
    try:
        state = await daemon.run_state(run_id)
    except (UnknownRunError, JournalCorrupt):
        return False
    info = state.gates.get(gate_id)
    return info is not None and info.request.hypotheses is not None


def _handle_errors(app: FastAPI, daemon: Daemon) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        field = _field_of(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            ctx = first.get("ctx")
            reason = (
                ctx.get("error", "malformed") if isinstance(ctx, dict) else "malformed"
            )
            return _problem(400, f"the body is not valid JSON: {reason}", "body")
        message = str(first.get("msg", "invalid"))
        ctx = first.get("ctx")
        inner = ctx.get("error") if isinstance(ctx, dict) else None
        if isinstance(inner, ConfigurationError):
            # A message model's own check, raised with the field it is about.
            field = ".".join(p for p in (field, inner.field) if p)
            message = inner.problem
            if field == "tasks" and await _at_explore_review(daemon, request):
                field = "hypotheses"  # an edit with neither, at an explore review
        if first.get("type") == "missing" and not field:
            return _problem(422, "a JSON body is required", "body")
        message = message.removeprefix("Value error, ")
        if not field:
            field = "body"
            if first.get("type") in ("model_attributes_type", "dict_type"):
                message = "expected a JSON object (Content-Type: application/json)"
        return _problem(422, f"{field}: {message}", field)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        reason = _unparsable_body(exc)
        if reason is not None:
            return _problem(400, f"the body is not valid JSON: {reason}", "body")
        response = _problem(
            exc.status_code, str(exc.detail), getattr(exc, "field", None)
        )
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(JournalCorrupt)
    async def unreadable(request: Request, exc: JournalCorrupt) -> JSONResponse:
        # A damaged row (the file was damaged or edited by hand): the run is
        # left as it is, as the resume left it; no request can change that.
        logger.warning("%s: %s", request.url.path, exc)
        detail = f"{exc}; the journal holds the run but cannot be read back"
        return _problem(409, detail, "run_id")

    @app.exception_handler(SupervisorError)
    async def unavailable(request: Request, exc: SupervisorError) -> JSONResponse:
        detail, headers = _not_serving(daemon, exc)
        yet = " yet" if detail is STARTING else ""
        response = _problem(503, f"not serving{yet}: {detail}")
        response.headers.update(headers)
        return response

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error answering %s", request.url.path)
        return _problem(500, "internal error (see the daemon's log)")
