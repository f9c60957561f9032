from __future__ import annotations

from replan import ScriptedModel


def test_the_scripted_model_reports_a_provider_and_one_model_for_every_role() -> None:
    model = ScriptedModel(lambda request: None, name="fixture")
    assert model.provider_name == "scripted"
    assert {model.model_for(r) for r in ("planner", "executor", "reviewer")} == {
        "fixture"
    }
