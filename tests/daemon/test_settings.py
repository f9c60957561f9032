"""Daemon settings: flags win over REPLAN_* variables, which win over the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replan import ConfigurationError
from replan.daemon import load_settings


def test_flags_then_environment_then_the_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "replan.toml"
    config.write_text(
        'port = 9001\nhost = "127.0.0.2"\nmodel_latency_s = 0.5\n'
        "[default_limits]\nmax_replans = 1\n[workers]\nexecutor = 3\n"
    )
    monkeypatch.setenv("REPLAN_PORT", "9002")
    monkeypatch.setenv("REPLAN_DEFAULT_LIMITS__MAX_CONCURRENCY", "7")
    settings = load_settings(config, model_latency_s=0.25, retention=None)
    assert settings.port == 9002
    assert settings.host == "127.0.0.2"
    assert settings.model_latency_s == 0.25
    assert settings.default_limits.max_concurrency == 7
    assert settings.workers == {"executor": 3}
    assert settings.retention == "compact"
    assert settings.loopback


def test_the_defaults_are_those_the_readme_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("REPLAN_"):
            monkeypatch.delenv(name)
    settings = load_settings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8470)
    assert settings.data_dir == Path("replan-data")
    assert settings.model == "scripted:demo"
    assert settings.max_active_runs == 1000
    assert settings.max_body_bytes == 1_048_576
    assert settings.drain_grace_s == 10
    assert settings.heartbeat_s == 15
    assert settings.retention == "compact"
    assert settings.retention_age_s == 7 * 86_400
    assert settings.retention_interval_s == 3600
    assert settings.redrive_interval_s == 30
    assert settings.journal_lease_s == 30
    assert settings.log_level == "info"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"port": 70_000}, "port"),
        ({"workers": {"painter": 2}}, "workers"),
        ({"retention": "shred"}, "retention"),
        ({"drain_grace_s": -1}, "drain_grace_s"),
        # Each body within the limit is read into memory whole.
        ({"max_body_bytes": 64 * 1_048_576 + 1}, "max_body_bytes"),
        # Longer, and `replan watch` would take the silence for a dead stream.
        ({"heartbeat_s": 31}, "heartbeat_s"),
        # Shorter, and every idle event stream is a busy loop of keep-alives.
        ({"heartbeat_s": 0.000001}, "heartbeat_s"),
        ({"heartbeat_s": 0.09}, "heartbeat_s"),
        # Older than a date can reach back: every retention pass would fail.
        ({"retention_age_s": 1e300}, "retention_age_s"),
        ({"retention_age_s": 2_100 * 365 * 86_400.0}, "retention_age_s"),
        ({"retention_age_s": float("inf")}, "retention_age_s"),
        # A retention pass every millisecond.
        ({"retention_interval_s": 0.001}, "retention_interval_s"),
        ({"retention_interval_s": 0}, "retention_interval_s"),
        ({"retention_interval_s": 1e300}, "retention_interval_s"),
        # A busy scan of the journal: 0 (or off) turns it off instead.
        ({"redrive_interval_s": 0.01}, "redrive_interval_s"),
        ({"redrive_interval_s": -1}, "redrive_interval_s"),
        ({"redrive_interval_s": "soon"}, "redrive_interval_s"),
        ({"redrive_interval_s": float("inf")}, "redrive_interval_s"),
        # A run lease shorter than its renewals can keep, or one that would
        # hold a dead daemon's runs for hours.
        ({"journal_lease_s": 0.5}, "journal_lease_s"),
        ({"journal_lease_s": 7200}, "journal_lease_s"),
        ({"journal_lease_s": True}, "journal_lease_s"),
    ],
)
def test_bad_settings_name_the_field(flags: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_settings(**flags)
    assert raised.value.field.startswith(field)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("port = true\n", "port"),
        ("drain_grace_s = false\n", "drain_grace_s"),
        ("[workers]\nexecutor = true\n", "workers"),
        ("[default_limits]\nmax_replans = true\n", "default_limits.max_replans"),
    ],
)
def test_a_toml_boolean_is_no_number(tmp_path: Path, text: str, field: str) -> None:
    # TOML has booleans; pydantic alone would read ``port = true`` as port 1.
    config = tmp_path / "replan.toml"
    config.write_text(text)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(config)
    assert raised.value.field == field
    assert "not true or false" in raised.value.problem


def test_numbers_from_the_environment_are_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REPLAN_PORT", "9001")
    monkeypatch.setenv("REPLAN_DRAIN_GRACE_S", "2.5")
    monkeypatch.setenv("REPLAN_MAX_BODY_BYTES", str(64 * 1_048_576))
    settings = load_settings()
    assert (settings.port, settings.drain_grace_s) == (9001, 2.5)
    assert settings.max_body_bytes == 64 * 1_048_576


def test_replan_config_names_the_file_as_config_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPLAN_PORT", raising=False)
    config = tmp_path / "replan.toml"
    config.write_text("port = 9001\n")
    given = tmp_path / "given.toml"
    given.write_text("port = 9002\n")
    monkeypatch.setenv("REPLAN_CONFIG", str(config))
    assert load_settings().port == 9001
    assert load_settings(given).port == 9002  # --config wins
    monkeypatch.setenv("REPLAN_CONFIG", "")  # as compose files leave it: none
    assert load_settings().port == 8470
    monkeypatch.setenv("REPLAN_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigurationError, match="no such file") as refused:
        load_settings()
    assert refused.value.field == "config"


def test_a_missing_config_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such file"):
        load_settings(tmp_path / "nope.toml")


def test_a_config_path_that_is_no_file_says_so(tmp_path: Path) -> None:
    # A directory, or a device such as /dev/null, is there: not "no such file".
    for path in (tmp_path, Path(os.devnull)):
        with pytest.raises(ConfigurationError, match="not a file") as refused:
            load_settings(path)
        assert refused.value.field == "config"
        assert str(path) in str(refused.value)


def test_serve_reports_bad_settings_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from replan.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["serve", "--port", "-1", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replan: error: port:")
    for given in ("openai:", "openai: "):
        assert main(["serve", "--model", given, "--data-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == (
            f"replan: error: model: {given!r} names no model: use openai:<model name>\n"
        )
    assert main(["serve", "--model", "openai:gpt-x", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    # serve has no --base-url: the endpoint comes from OPENAI_BASE_URL.
    assert err == (
        "replan: error: api_key: no API key: set OPENAI_API_KEY, or "
        "OPENAI_BASE_URL for a local server\n"
    )


def test_a_latency_given_an_openai_model_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was taken and ignored: the calls went at the endpoint's pace.
    from replan.cli import main

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    argv = ["serve", "--model", "openai:m", "--model-latency", "0.5"]
    assert main([*argv, "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "replan: error: model_latency_s: a simulated latency is for scripted "
        "models; 'openai:m' answers at its endpoint's own pace\n"
    )


@pytest.mark.parametrize("host", ["", "  "])
def test_a_blank_host_is_named_as_blank(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was refused as "api_token: refusing to listen on  without
    # REPLAN_API_TOKEN set", or with a token as a host that does not resolve.
    from replan.cli import main

    assert main(["serve", "--host", host, "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "replan: error: host: name an address to listen on (default 127.0.0.1)\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--data-dir", "data_dir: name a directory (default ./replan-data)"),
        ("--config", "config: name a TOML file, not a blank path"),
    ],
)
def test_a_blank_data_dir_or_config_is_refused_not_taken_for_the_current_dir(
    flag: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Path("") is ".": --data-dir "" kept the journal and the token in the
    # current directory, and --config "" said "no such file: .".
    from replan.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--port", "0", flag, ""]) == 2
    assert capsys.readouterr().err == f"replan: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


def test_an_openai_model_takes_its_prompt_budget_and_provider_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from replan.daemon._models import build_model
    from replan.llm import OpenAIModel

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("REPLAN_MODEL_MAX_PROMPT_CHARS", "5000")
    monkeypatch.delenv("REPLAN_MODEL_PROVIDER", raising=False)
    model = build_model(load_settings(None, model="openai:m"))
    assert isinstance(model, OpenAIModel)
    assert model.max_prompt_chars == 5000
    assert model.provider_name == "openai"
    monkeypatch.setenv("REPLAN_MODEL_PROVIDER", "vllm")
    served = build_model(load_settings(None, model="openai:m"))
    assert isinstance(served, OpenAIModel)
    assert served.provider_name == "vllm"
    monkeypatch.setenv("REPLAN_MODEL_MAX_PROMPT_CHARS", "0")
    unbounded = build_model(load_settings(None, model="openai:m"))
    assert isinstance(unbounded, OpenAIModel)
    assert unbounded.max_prompt_chars is None
    for chars in ("999", "-1"):
        monkeypatch.setenv("REPLAN_MODEL_MAX_PROMPT_CHARS", chars)
        with pytest.raises(ConfigurationError) as caught:
            load_settings(None)
        assert caught.value.field == "model_max_prompt_chars"


@pytest.mark.parametrize(
    ("variable", "tools"),
    [
        ('["kit:search", "kit:mail"]', ["kit:search", "kit:mail"]),
        ("kit:search, kit:mail", ["kit:search", "kit:mail"]),
        ("kit:search", ["kit:search"]),
        ("", []),
    ],
)
def test_replan_tools_takes_a_json_list_or_commas(
    monkeypatch: pytest.MonkeyPatch, variable: str, tools: list[str]
) -> None:
    monkeypatch.setenv("REPLAN_TOOLS", variable)
    assert load_settings(None).tools == tools


def test_a_tools_file_setting_and_a_broken_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "replan.toml"
    config.write_text('tools = ["kit:search"]\n')
    assert load_settings(config).tools == ["kit:search"]
    monkeypatch.setenv("REPLAN_TOOLS", "[kit:search")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(config)
    assert caught.value.field == "tools"
    assert "not a JSON list" in caught.value.problem


@pytest.mark.parametrize(
    ("variable", "workers"),
    [
        ("executor=64", {"executor": 64}),
        ("executor=64, planner=2", {"executor": 64, "planner": 2}),
        ('{"executor": 64}', {"executor": 64}),
        ("", {}),
    ],
)
def test_replan_workers_takes_what_the_flag_takes_or_a_json_object(
    monkeypatch: pytest.MonkeyPatch, variable: str, workers: dict[str, int]
) -> None:
    # --workers executor=64 is also REPLAN_WORKERS=executor=64.
    monkeypatch.setenv("REPLAN_WORKERS", variable)
    assert load_settings(None).workers == workers


@pytest.mark.parametrize(
    ("variable", "problem"),
    [
        ("executor", "ROLE=N"),
        ("executor=x", "integer"),
        ("painter=2", "unknown role 'painter'"),
        ("{bad", "not a JSON object"),
        ("executor=2, executor=3", "executor is given twice"),
        ('{"executor": 2, "executor": 3}', "executor is given twice"),
    ],
)
def test_a_bad_replan_workers_names_the_field_and_the_form(
    monkeypatch: pytest.MonkeyPatch, variable: str, problem: str
) -> None:
    monkeypatch.setenv("REPLAN_WORKERS", variable)
    with pytest.raises(ConfigurationError) as caught:
        load_settings(None)
    assert caught.value.field.startswith("workers")
    assert problem in caught.value.problem


def test_a_broken_variable_is_not_blamed_on_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "replan.toml"
    config.write_text("port = 9001\n")
    monkeypatch.setenv("REPLAN_DEFAULT_LIMITS", "{bad")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(config)
    assert caught.value.problem.startswith("the REPLAN_* variables: ")
    config.write_text("port = [\n")
    monkeypatch.delenv("REPLAN_DEFAULT_LIMITS")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(config)
    assert caught.value.problem.startswith(f"{config}: ")


@pytest.mark.parametrize(("value", "seconds"), [("off", 0.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_scan_for_runs_let_go_of_is_set_or_turned_off_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, seconds: float
) -> None:
    assert load_settings().redrive_interval_s == 30.0
    monkeypatch.setenv("REPLAN_REDRIVE_INTERVAL_S", value)
    assert load_settings().redrive_interval_s == seconds


def test_a_scan_interval_too_short_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_settings(redrive_interval_s=0.05)
    assert str(raised.value) == (
        "redrive_interval_s: must be at least 0.1 seconds, or 0 (off) not to look"
    )


def test_the_longest_retention_age_is_a_cutoff_a_date_can_hold() -> None:
    from datetime import UTC, datetime, timedelta

    from replan.daemon._settings import MAX_RETENTION_AGE_S

    settings = load_settings(retention_age_s=MAX_RETENTION_AGE_S)
    cutoff = datetime.now(UTC) - timedelta(seconds=settings.retention_age_s)
    assert cutoff.year > 1000


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("REPLAN_HEARTBEAT_S", "0.000001", "greater than or equal to 0.1"),
        ("REPLAN_RETENTION_INTERVAL_S", "0.001", "greater than or equal to 0.1"),
        ("REPLAN_RETENTION_AGE_S", "1e300", "less than or equal to"),
    ],
)
def test_a_busy_loop_or_an_unreachable_date_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert raised.value.field == variable.removeprefix("REPLAN_").lower()
    assert problem in raised.value.problem


def test_a_role_given_twice_to_workers_is_a_bad_argument(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from replan.cli import main

    # A config file that is not there: without the check, the command ends
    # on it rather than serving.
    argv = ["serve", "--workers", "executor=2", "--workers", "executor=3"]
    argv += ["--config", "/nonexistent/replan.toml"]
    assert main(argv) == 2
    assert "--workers: executor is given twice" in capsys.readouterr().err


def test_port_0_is_any_port_and_an_empty_port_file_is_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # REPLAN_PORT_FILE= (as compose files leave a variable) wrote to "."
    # and stopped the daemon with "unexpected ValueError".
    monkeypatch.setenv("REPLAN_PORT_FILE", "")
    settings = load_settings(port=0)
    assert (settings.port, settings.port_file) == (0, None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    assert load_settings(port_file="run/port").port_file == Path("run/port")
    with pytest.raises(ConfigurationError) as refused:
        load_settings(port_file="no-run/port")
    assert str(refused.value) == "port_file: no directory no-run to write port in"
