from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import get_args

import pytest

from replan import ScriptedModel
from replan.messages import Event
from replan.store import PostgresStore
from replan.store import _postgres_pool as postgres_pool
from replan.supervisor import _forwarding as forwarding

README = Path(__file__).parent.parent / "README.md"


def test_the_readme_tour_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    tour = next(b for b in blocks if "anyio.run(main)" in b)
    monkeypatch.chdir(tmp_path)
    exec(compile(tour, "README.md", "exec"), {"__name__": "readme_tour"})
    out = capsys.readouterr().out
    assert "1 run_submitted" in out
    assert "completed the answer" in out
    assert (tmp_path / "runs.db").exists()


def test_the_readme_gives_the_two_setup_commands() -> None:
    text = README.read_text()
    assert 'python -m pip install -e ".[dev]" && replan demo' in text
    assert "python -m pytest" in text


def test_the_readme_explore_example_runs_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "anyio.run(explore)" in b)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme_explore"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("completed 2 candidate hypotheses selected")
    assert lines[1].startswith("H1 ")
    assert lines[1].endswith("Solo cooks leave because recipes serve four")
    assert len(lines) == 3


def test_the_readme_openai_example_builds_offline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "REPLAN_MODEL"):
        monkeypatch.delenv(name, raising=False)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "OpenAIModel(" in b)
    scope: dict[str, object] = {"__name__": "readme_openai"}
    exec(compile(example, "README.md", "exec"), scope)
    model = scope["model"]
    assert model.model_for("executor") == "qwen2.5:3b"  # type: ignore[attr-defined]
    assert model.provider_name == "ollama"  # type: ignore[attr-defined]


def test_the_journal_section_names_every_event_kind_and_no_other() -> None:
    (union, _) = get_args(Event)
    kinds = {get_args(t.model_fields["kind"].annotation)[0] for t in get_args(union)}
    section = README.read_text().split("## The journal", 1)[1]
    listing = section.split("appended to the store before it takes effect", 1)[0]
    assert set(re.findall(r"`([a-z_]+)`", listing)) == kinds


def test_the_replan_run_synopsis_names_every_flag_the_command_takes() -> None:
    import argparse

    from replan.cli import build_parser

    section = README.read_text().split("### `replan run`", 1)[1]
    synopsis = section.split("```bash\n", 1)[1].split("```", 1)[0]
    (commands,) = (
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    run = commands.choices["run"]
    flags = {f for a in run._actions for f in a.option_strings if f.startswith("--")}
    assert set(re.findall(r"--[a-z][a-z-]*", synopsis)) == flags - {"--help"}


def test_every_link_within_the_readme_leads_to_one_of_its_headings() -> None:
    text = README.read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    headings = re.findall(r"^#{1,6} (.+)$", prose, re.M)
    # GitHub's anchors: lower case, punctuation dropped, spaces as hyphens.
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert "a-short-tour-of-the-python-api" in links
    assert links - anchors == set()


def _postgres_section() -> str:
    return README.read_text().split("### PostgreSQL journal", 1)[1].split("\n## ", 1)[0]


async def test_the_readme_postgres_example_serves_on_a_journal(
    postgres_dsn: str,
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", _postgres_section(), re.S)
    (example,) = blocks
    written = "postgresql://replan@db.internal/agents"
    assert written in example
    scope: dict[str, object] = {"__name__": "readme_postgres"}
    exec(compile(example.replace(written, postgres_dsn), "README.md", "exec"), scope)
    await scope["serve"](ScriptedModel(lambda request: None))  # type: ignore[operator]
    async with PostgresStore(postgres_dsn) as store:
        assert await store.list_runs() == []
        assert store.schema == "replan"


def test_the_postgres_journal_section_gives_the_stores_defaults() -> None:
    text = " ".join(_postgres_section().split())
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(PostgresStore).parameters.items()
    }
    assert f"`connect_timeout_s`, {defaults['connect_timeout_s']:g} s" in text
    assert f"`pool_size` ({defaults['pool_size']})" in text
    assert f"`PostgresStore(dsn, lease_s={defaults['lease_s']})`" in text
    assert f"`PostgresStore(dsn, reconnect_s={defaults['reconnect_s']})`" in text
    assert f"`{defaults['schema']}` unless `schema=`" in text
    lock_s = postgres_pool.LOCK_TIMEOUT_MS / 1000
    assert f"waits at most {lock_s:g} s for a lock" in text
    first, longest = postgres_pool.FIRST_DELAY_S, postgres_pool.LONGEST_DELAY_S
    assert (
        f"after {first:g} s, then twice as long each time up to {longest:g} s" in text
    )
    assert f"within {forwarding.FORWARD_WAIT_S:g} s" in text
    assert f"up to {forwarding.FORWARD_WAIT_S:g} s more" in text
    assert forwarding.REQUEST_POLL_S == 0.5
    assert "every half second" in text
