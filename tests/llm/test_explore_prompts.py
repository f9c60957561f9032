"""The explore prompt templates: their format, and that every placeholder is a
key the explore flow really sends for that role and purpose."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "supervisor"))
from explore_scripts import ExploreScript, Idea, explore_spec, run_explore

PROMPTS = Path(__file__).parent.parent.parent / "replan" / "llm" / "prompts"
TEMPLATES = {
    "planner.gaps.md": ("planner", "gaps"),
    "planner.hypotheses.md": ("planner", "hypotheses"),
    "planner.validation.md": ("planner", "validation"),
    "reviewer.critique.explore.md": ("reviewer", "critique"),
    "ranker.compare.explore.md": ("ranker", "compare"),
    "evolver.evolve.explore.md": ("evolver", "evolve"),
}


def parse(text: str) -> tuple[int, str, str]:
    header = re.match(r"\A---\nversion: (\d+)\n---\n", text)
    assert header, "a template starts with a version header"
    body = text[header.end() :]
    parts = re.split(r"^## (system|user)\s*$", body, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert set(sections) == {"system", "user"}
    return int(header.group(1)), sections["system"], sections["user"]


@pytest.fixture(scope="module")
def contexts() -> dict[tuple[str, str], set[str]]:
    """The context keys of each explore request in a run that evolves once."""
    from explore_scripts import scores

    weak = scores(plausibility=0.2)
    script = ExploreScript(
        generated=[
            Idea("Solo cooks leave because every recipe serves four"),
            Idea("Leftovers make planning feel wasteful", [weak]),
            # scored out of range: re-asked with the problem
            Idea("Budgets keep cooks planning", [scores(novelty=8.0), scores()]),
        ],
        evolved=[[Idea("Cooks quit when skipping a week wastes food")]],
    )

    async def go():
        return await run_explore(explore_spec(max_iterations=2), script)

    outcome = anyio.run(go)
    keys: dict[tuple[str, str], set[str]] = {}
    for call in outcome.model.calls:
        keys.setdefault((call.role, call.purpose), set()).update(call.context)
    return keys


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_explore_template_is_versioned_with_a_system_and_a_user_part(
    name: str,
) -> None:
    version, system, user = parse((PROMPTS / name).read_text(encoding="utf-8"))
    assert version == (2 if name == "reviewer.critique.explore.md" else 1)
    assert "Answer as JSON in the requested format." in system
    assert "{{goal}}" in user


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_placeholder_is_a_context_key_the_flow_sends(
    name: str, contexts: dict[tuple[str, str], set[str]]
) -> None:
    _, system, user = parse((PROMPTS / name).read_text(encoding="utf-8"))
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", system + user))
    assert used <= contexts[TEMPLATES[name]], used - contexts[TEMPLATES[name]]


def test_the_critique_template_names_all_seven_lenses_and_confidence() -> None:
    _, system, _ = parse(
        (PROMPTS / "reviewer.critique.explore.md").read_text(encoding="utf-8")
    )
    for lens in (
        "novelty",
        "plausibility",
        "evidence",
        "feasibility",
        "impact",
        "clarity",
        "safety",
        "confidence",
    ):
        assert f"`{lens}`" in system or f"scores.{lens}" in system, lens
