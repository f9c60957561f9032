from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

import replan

PACKAGES = [
    "replan",
    "replan.actors",
    "replan.explore",
    "replan.llm",
    "replan.messages",
    "replan.store",
    "replan.supervisor",
    "replan.telemetry",
    "replan.daemon",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_every_public_name_and_nothing_else(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(module).items()
        if (not attr.startswith("_") or attr == "__version__")
        and not isinstance(value, types.ModuleType)
        and attr not in {"annotations", "logging", "TYPE_CHECKING"}
    }
    # Names a module loads on first use (its _LAZY table) are public too.
    public |= set(getattr(module, "_LAZY", {}))
    assert isinstance(module.__all__, tuple)
    assert set(module.__all__) == public


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_exists(name: str) -> None:
    module = importlib.import_module(name)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_the_design_documents_public_names_are_exported() -> None:
    for name in (
        "Supervisor",
        "RunSpec",
        "Limits",
        "Task",
        "TaskStatus",
        "TaskDraft",
        "PlanProposal",
        "TaskOutcome",
        "Trigger",
        "Verdict",
        "PlanVersion",
        "GateRequest",
        "GateResolution",
        "RunResult",
        "RunStatus",
        "ScriptedModel",
        "MemoryStore",
        "SQLiteStore",
        "ConfigurationError",
    ):
        assert name in replan.__all__


def _drawn_tree() -> dict[str, str]:
    """Each exception the tree in ``replan._errors`` draws, and its parent."""
    from replan import _errors

    parents: dict[str, str] = {}
    path = ["ReplanError"]
    for line in (_errors.__doc__ or "").splitlines():
        branch = max(line.find("├── "), line.find("└── "))
        if branch < 0:
            continue
        depth = (branch - 4) // 4 + 1
        name = line[branch + 4 :].split()[0]
        path[depth:] = [name]
        parents[name] = path[depth - 1]
    return parents


def test_the_exception_tree_draws_every_public_exception_under_its_base() -> None:
    drawn = _drawn_tree()
    public = {
        value
        for name in PACKAGES
        for value in vars(importlib.import_module(name)).values()
        if isinstance(value, type) and issubclass(value, replan.ReplanError)
    }
    assert {c.__name__ for c in public} - {"ReplanError"} == set(drawn)
    for cls in public - {replan.ReplanError}:
        base = next(b for b in cls.__bases__ if issubclass(b, replan.ReplanError))
        assert drawn[cls.__name__] == base.__name__, cls


def test_importing_replan_does_not_import_the_daemons_dependencies() -> None:
    import subprocess
    import sys

    code = (
        "import sys, replan, replan.cli; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'pydantic_settings', "
        "'starlette', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_openai_package_loads_only_when_the_adapter_is_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, replan; before = 'openai' in sys.modules; "
        "from replan import OpenAIModel; from replan.llm import BackoffPolicy; "
        "print(before, 'openai' in sys.modules, OpenAIModel.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True", "OpenAIModel"]


def test_the_command_line_loads_openai_only_for_the_commands_that_call_it() -> None:
    # `replan demo`, `show` and `runs` start in half the time without it.
    import subprocess
    import sys

    code = "import sys, replan.cli; print('openai' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False"]


def test_a_users_program_is_type_checked_against_replans_annotations(
    tmp_path: Path,
) -> None:
    # The package says it is typed (py.typed): a user's mypy reads its
    # annotations, and a misspelt name is an error, not an untyped object.
    assert (Path(replan.__file__).parent / "py.typed").is_file()
    (tmp_path / "user.py").write_text(
        "from collections.abc import AsyncIterator\n"
        "from replan import Event, RunSpec, ScriptedModel, Supervisor\n"
        "async def main() -> None:\n"
        "    async with Supervisor(ScriptedModel(lambda r: None)) as sup:\n"
        "        handle = await sup.submit(RunSpec(goal='g'))\n"
        "        events: AsyncIterator[Event] = handle.events()\n"
        "        async for event in events:\n"
        "            print(event.seq)\n"
    )
    (tmp_path / "typo.py").write_text("from replan import ScriptdModel\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "user.py",
            "typo.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, done.stdout
    assert errors[0].startswith('typo.py:1: error: Module "replan" has no attribute')


def test_importing_replan_does_not_import_psycopg() -> None:
    code = (
        "import sys, replan, replan.store, replan.cli; print('psycopg' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False"]


def test_the_postgres_store_without_its_extra_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "try:\n"
        "    from replan.store import PostgresStore\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "pip install 'replan[postgres]'" in out.stdout
