"""The command line against a daemon: submit, runs, show, watch, gates,
approve, reject, cancel (``--url`` or ``REPLAN_URL``; token from
``REPLAN_API_TOKEN``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import _render
from ._client import Client, ClientError, segment
from ._render import terminal_json, terminal_text
from .messages import GateRequest, RunStatus
from .store import ToolEffectRecord
from .supervisor import RunState, apply, replay

COMMANDS = ("submit", "watch", "gates", "approve", "reject", "cancel")
"""Commands that only talk to a daemon (``runs`` and ``show`` also read a
local journal with ``--db``)."""

MAX_SPEC_BYTES = 64 * 1_048_576
"""The largest spec ``submit`` reads: the most any daemon takes
(``max_body_bytes``), so that an endless input (``/dev/zero``, a pipe that
never ends) is refused rather than read until memory runs out."""


class RemoteError(Exception):
    """One line for ``replan: error: ...``; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def _daemon_answers() -> Iterator[None]:
    """Client errors, and answers of a shape no replan daemon gives (a JSON
    server that is something else), as one-line :class:`RemoteError`."""
    try:
        yield
    except ClientError as exc:
        raise RemoteError(str(exc), exc.code) from None
    except (KeyError, TypeError, IndexError, AttributeError, ValidationError) as exc:
        problem = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise RemoteError(
            f"the server's answer is not one a replan daemon gives ({problem})"
        ) from None


def add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", metavar="URL", help="the daemon (default: $REPLAN_URL)"
    )


def add_commands(commands: Any) -> None:
    submit = commands.add_parser(
        "submit", help="submit a run to a daemon; prints its id"
    )
    submit.add_argument(
        "spec",
        metavar="SPEC",
        nargs="?",
        help="a RunSpec JSON file ('-' for stdin); or give --goal",
    )
    submit.add_argument("--goal", help="the goal (a minimal spec)")
    submit.add_argument("--pattern", choices=["contract", "discovery", "hybrid"])
    submit.add_argument("--watch", action="store_true", help="follow its events")
    submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the submission's Idempotency-Key (default: a new one): the same "
        "key submitted again gets the run it started, never a second run",
    )
    add_url(submit)

    watch = commands.add_parser(
        "watch", help="follow a run's events until it ends (reconnects)"
    )
    watch.add_argument("run_id", metavar="RUN_ID")
    add_url(watch)

    gates = commands.add_parser(
        "gates", help="list the gates waiting for a person, by the ids approve takes"
    )
    gates.add_argument(
        "--run", dest="run_id", metavar="RUN_ID", help="only this run's gates"
    )
    add_url(gates)

    for name, verb in (("approve", "approve"), ("reject", "reject")):
        gate = commands.add_parser(name, help=f"{verb} a pending gate")
        gate.add_argument("gate_id", metavar="GATE_ID")
        gate.add_argument("--by", default="cli", help="who decides (default cli)")
        gate.add_argument("--note", default="", help="why")
        add_url(gate)

    cancel = commands.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", metavar="RUN_ID")
    add_url(cancel)


def run(args: argparse.Namespace) -> int:
    """Run one remote command; RemoteError carries a one-line failure."""
    with _daemon_answers(), Client.from_env(getattr(args, "url", None)) as client:
        return _COMMANDS[args.command](client, args)


def _submit(client: Client, args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {}
    if args.spec is not None:
        spec = _read_spec(args.spec)
    if args.goal is not None:  # a blank one too, for the daemon to refuse
        spec["goal"] = _text("--goal", args.goal)
    if args.pattern:
        spec["pattern"] = args.pattern
    if "goal" not in spec:
        raise RemoteError("give a SPEC file or --goal", 2)
    # Sent again through a lost connection, a restart or a drain: the key
    # makes it the same run, never a second one.
    key = {"Idempotency-Key": _key(args.idempotency_key)}
    accepted = client.call("POST", "/v1/runs", json=spec, headers=key, resend="always")
    print(terminal_text(accepted["run_id"]))
    if args.watch:
        return _follow(client, accepted["run_id"])
    return 0


def _key(given: str | None) -> str:
    """The submission's idempotency key: ``given``, or a new one."""
    if given is None:
        return uuid.uuid4().hex
    key = given.strip()
    if not (1 <= len(key) <= 255 and key.isascii() and key.isprintable()):
        raise RemoteError(
            "--idempotency-key: 1 to 255 printable ASCII characters expected", 2
        )
    return key


def _read_spec(name: str) -> dict[str, Any]:
    """The RunSpec JSON object in file ``name`` (``-``: stdin); every problem
    is a bad argument (exit 2)."""
    try:
        if name == "-":
            text = sys.stdin.read(MAX_SPEC_BYTES + 1)
        else:
            with Path(name).open(encoding="utf-8") as file:
                text = file.read(MAX_SPEC_BYTES + 1)
        if len(text) > MAX_SPEC_BYTES:
            raise RemoteError(
                f"cannot read the spec {name}: it is larger than "
                f"{MAX_SPEC_BYTES // 1_048_576} MiB, the most a daemon takes",
                2,
            )
        spec = json.loads(text)
    except RecursionError:
        raise RemoteError(
            f"cannot read the spec {name}: it nests too deeply", 2
        ) from None
    except (OSError, ValueError) as exc:
        raise RemoteError(f"cannot read the spec {name}: {exc}", 2) from None
    if not isinstance(spec, dict):
        raise RemoteError(f"the spec {name} must be a JSON object", 2)
    found = _unsendable(spec)
    if found is not None:
        field, problem = found
        raise RemoteError(f"cannot read the spec {name}: {field} {problem}", 2)
    return spec


def _unsendable(spec: dict[str, Any]) -> tuple[str, str] | None:
    """The dotted path of the first value JSON text cannot carry, and why."""
    stack: list[tuple[str, Any]] = [("", spec)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, (
                "is not a finite number "
                "(no NaN, Infinity or number too large for a float)"
            )
        if isinstance(value, str) and not _utf8(value):
            return path, "holds a lone UTF-16 surrogate escape, which is no text"
        if isinstance(value, dict):
            for key, inner in value.items():
                where = f"{path}.{key}" if path else key
                if not _utf8(key):
                    return path or "the spec", (
                        "has a key with a lone UTF-16 surrogate escape, which is "
                        "no text"
                    )
                stack.append((where, inner))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", inner) for i, inner in enumerate(value))
    return None


def _text(flag: str, value: str | None) -> str | None:
    """``value`` of ``flag``, refused as a bad argument if it is no text: a
    shell passes bytes that are no UTF-8 as lone surrogates, which no JSON
    body can carry."""
    if value is not None and not _utf8(value):
        raise RemoteError(f"{flag}: {value!r} is no text (a lone UTF-16 surrogate)", 2)
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _watch(client: Client, args: argparse.Namespace) -> int:
    try:
        return _follow(client, args.run_id)
    except ClientError as exc:
        if exc.status != 404:
            raise
    # No run has that id: a unique prefix of one will do, as for show.
    run_id, _ = _find_run(client, args.run_id)
    return _follow(client, run_id)


def _follow(client: Client, run_id: str) -> int:
    """Print the run's events to its end; 0 when it completed, as ``replan
    run`` exits, else a :class:`RemoteError` saying how it ended."""
    state: RunState | None = None
    for event in client.events(run_id):
        state = apply(state, event)
        for line in _render.event_lines(event, state, full_gate_ids=True):
            print(terminal_text(line), flush=True)
    if state is None or state.status is RunStatus.COMPLETED:
        return 0
    reason = " ".join((state.stop_reason or "").split())
    ended = f"run {state.run_id} ended {state.status.value}"
    raise RemoteError(f"{ended}: {reason}" if reason else ended)


def _gates(client: Client, args: argparse.Namespace) -> int:
    """The gates waiting for a person, oldest first, as ``show`` names them:
    the full id ``approve`` and ``reject`` take, and what each asks."""
    run_id = args.run_id
    if run_id:
        # An unknown run is told as show tells it, a prefix taken as there.
        run_id, _ = _find_run(client, run_id)
    lines: list[str] = []
    for gate, holder in _open_gates(client, run_id):
        request = GateRequest.model_validate(gate)
        if lines:
            lines.append("")
        lines += _render.gate_lines(request, "", full_id=True)
        if holder is not None:
            lines.append(
                f"    its run is driven by daemon {holder}; any daemon takes the answer"
            )
    for line in lines:
        print(terminal_text(line))
    if not lines:
        print("no gates waiting", file=sys.stderr)
    return 0


def _open_gates(
    client: Client, run_id: str | None = None
) -> Iterator[tuple[Any, str | None]]:
    """Every gate waiting for a person (of one run, if ``run_id`` is
    given), over as many pages as it takes, oldest first, each with the
    daemon that drives its run if another daemon does."""
    seen: set[str] = set()
    params: dict[str, Any] | None = {"limit": PAGE}
    while params is not None:
        if run_id:
            params["run_id"] = run_id
        page = client.call("GET", "/v1/gates", params=params)
        elsewhere: dict[str, str] = page.get("elsewhere") or {}
        for gate in page["gates"]:
            # Paged by offset (a daemon from before cursors), a gate answered
            # meanwhile moves the later ones a place up: one already listed
            # may come again, and one is skipped.
            if gate["gate_id"] not in seen:
                seen.add(gate["gate_id"])
                yield gate, elsewhere.get(gate["gate_id"])
        # A cursor does not move as gates are answered; a daemon that does
        # not page its gates gives them all at once.
        if page.get("next_cursor") is not None:
            params = {"limit": PAGE, "cursor": page["next_cursor"]}
        elif page.get("next_offset") is not None:
            params = {"limit": PAGE, "offset": page["next_offset"]}
        else:
            params = None


def _answer(client: Client, args: argparse.Namespace) -> int:
    body = {
        "decision": args.command,
        "by": _text("--by", args.by),
        "note": _text("--note", args.note),
    }
    gate_id = args.gate_id
    try:
        answer = client.call(
            "POST", f"/v1/gates/{segment(gate_id)}", json=body, resend="unavailable"
        )
    except ClientError as exc:
        if exc.status != 404:
            raise
        full_id = _find_gate(client, gate_id)
        if full_id is None:
            raise
        answer = client.call(
            "POST", f"/v1/gates/{segment(full_id)}", json=body, resend="unavailable"
        )
    said = f"gate {answer['gate_id']}: {answer['decision']} (run {answer['run_id']})"
    # 202: sent on to the daemon that drives the run (it says where).
    print(terminal_text(answer.get("detail") or said))
    return 0


def _find_gate(client: Client, short_id: str) -> str | None:
    """The full id of the one waiting gate named ``short_id`` within its run
    (``g1`` for ``RUN_ID-g1``), or None if no gate waits under that name."""
    matches = sorted(
        g["gate_id"]
        for g, _ in _open_gates(client)
        if g["gate_id"].endswith(f"-{short_id}")
    )
    if len(matches) > 1:
        raise ClientError(
            f"gate {short_id} is waiting in {len(matches)} runs: give its full id "
            f"({', '.join(matches[:2])}{', ...' if len(matches) > 2 else ''})",
            code=2,
        )
    return matches[0] if matches else None


def _cancel(client: Client, args: argparse.Namespace) -> int:
    # The same answer or cancel sent again waits for the first: safe to send
    # again while the daemon starts (its 503 has Retry-After then).
    ended = client.call(
        "POST", f"/v1/runs/{segment(args.run_id)}/cancel", resend="unavailable"
    )
    said = f"run {ended['run_id']}: {ended['status']}"
    print(terminal_text(ended.get("detail") or said))
    return 0


def list_runs(args: argparse.Namespace) -> int:
    """``replan runs --url``: one line per run, newest first."""
    with _daemon_answers():
        with Client.from_env(args.url) as client:
            runs = _newest_runs(client, args.limit)
        lines = []
        for s in runs:
            goal = " ".join(s["goal"].split())
            if len(goal) > 60:
                goal = goal[:59] + "…"
            shape = s["kind"] if s.get("kind") == "explore" else s["pattern"]
            lines.append(f"{s['run_id']}  {s['status']:<17} {shape:<9}  {goal}")
    for line in lines:
        print(terminal_text(line))
    if not lines:
        print("no runs", file=sys.stderr)
    return 0


PAGE = 1000
"""The most runs the API lists in one page."""


def _newest_runs(client: Client, limit: int) -> list[Any]:
    """The daemon's ``limit`` newest runs, over as many pages as it takes."""
    runs: list[Any] = []
    offset: int | None = 0
    while offset is not None and len(runs) < limit:
        page = client.call(
            "GET",
            "/v1/runs",
            params={"limit": min(limit - len(runs), PAGE), "offset": offset},
        )
        runs += page["runs"][: limit - len(runs)]
        offset = page["next_offset"]
    return runs


def show(args: argparse.Namespace) -> int:
    """``replan show --url``: the run rebuilt from its events, as with --db."""
    with _daemon_answers():
        with Client.from_env(args.url) as client:
            run_id, view = _find_run(client, args.run_id)
            events = list(client.events(run_id, until=view["last_seq"]))
        state = replay(events)
    if args.json:
        print(terminal_json(state.result().model_dump_json(indent=2)))
    else:
        effects = [
            ToolEffectRecord.model_validate(record)
            for record in view.get("side_effects", [])
        ]
        for line in _render.run_report(state, effects):
            print(terminal_text(line))
    return 0


def _find_run(client: Client, run_id: str) -> tuple[str, Any]:
    """The run ``run_id``, or the one run of the daemon whose id starts with
    it (``show --db`` takes a prefix too); its id and its view."""
    try:
        return run_id, client.call("GET", f"/v1/runs/{segment(run_id)}")
    except ClientError as exc:
        if exc.status != 404 or not run_id:
            raise
    matches: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = client.call("GET", "/v1/runs", params={"limit": PAGE, "offset": offset})
        matches += [r["run_id"] for r in page["runs"] if r["run_id"].startswith(run_id)]
        offset = page["next_offset"]
    if len(matches) == 1:
        return matches[0], client.call("GET", f"/v1/runs/{segment(matches[0])}")
    if matches:
        raise ClientError(f"run id prefix {run_id} matches {len(matches)} runs")
    raise ClientError(f"404: no run {run_id}", 404)


_COMMANDS = {
    "submit": _submit,
    "watch": _watch,
    "gates": _gates,
    "approve": _answer,
    "reject": _answer,
    "cancel": _cancel,
}
