from __future__ import annotations

import importlib
import types

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
