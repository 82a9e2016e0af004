"""`rlserve serve`'s flags are generated from serve.config.Settings: each setting's name,
default and description are declared once, in its field, and nowhere else."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, SecretStr

from cli import settings_arguments
from serve import config
from serve.commands import serve as serve_command
from serve.process import production

# The flags `rlserve serve` had before they were generated; they must all still work.
EARLIER_FLAGS = [
    "--model-repository", "--config", "--host", "--port", "--workers", "--grpc-port",
    "--default-model", "--max-batch-size", "--max-wait-ms", "--max-queue-rows",
    "--default-deadline-ms", "--generation-deadline-ms", "--providers",
    "--allow-cpu-fallback", "--gpu-memory-limit-bytes", "--poll-interval-s",
    "--observation-bounds", "--drain-delay-s", "--log-level",
]  # fmt: skip


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlserve serve")
    serve_command.add_arguments(parser)
    return parser


def setting_actions() -> list[argparse.Action]:
    return [a for a in serve_parser()._actions if a.dest != "help"]


def parse(*argv: str) -> dict[str, object]:
    return serve_command.settings_given(serve_parser().parse_args(list(argv)))


def test_no_setting_of_a_model_is_declared_again_by_the_server() -> None:
    own = set(vars(config.Settings).get("__annotations__", {}))
    assert own, "Settings declares fields of its own"
    assert not own & set(config.ModelSettings.model_fields)
    assert set(config.ModelSettings.model_fields) < set(config.Settings.model_fields)


def test_every_setting_has_a_description() -> None:
    undescribed = [n for n, f in config.Settings.model_fields.items() if not f.description]
    assert undescribed == []


def test_every_flag_is_a_setting_whose_description_is_its_help() -> None:
    for action in setting_actions():
        field = config.Settings.model_fields[action.dest]
        assert action.default is None, f"{action.dest}: a default declared by the flag"
        assert action.help is not None
        help_text = action.help.replace("%%", "%")
        assert field.description is not None
        assert help_text.startswith(field.description + " ("), action.dest
        assert f"env RLSERVE_{action.dest.upper()}" in help_text


@pytest.mark.parametrize(
    ("flag", "default"),
    [
        ("--max-batch-size", "32"),
        ("--max-wait-ms", "0"),
        ("--inline-max-ms", "0.5"),
        ("--host", "127.0.0.1"),
        ("--model-repository", "model_repository"),
        ("--observation-bounds", "allow"),
        ("--access-log", "true"),
        ("--allow-cpu-fallback", "false"),
        ("--providers", "auto"),
    ],
)
def test_the_help_shows_the_fields_default(flag: str, default: str) -> None:
    (action,) = [a for a in setting_actions() if flag in a.option_strings]
    assert action.help is not None
    assert action.help.endswith(f"; default: {default})")


def test_every_setting_has_a_flag_but_those_said_not_to() -> None:
    flagged = {a.dest for a in setting_actions()}
    assert not flagged & set(serve_command.NO_FLAG)
    assert flagged | set(serve_command.NO_FLAG) == set(config.Settings.model_fields)


def test_help_lists_every_flag_with_its_description() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "100000"},  # one line per flag: nothing wrapped
    )
    shown = " ".join(done.stdout.split())
    for action in setting_actions():
        description = config.Settings.model_fields[action.dest].description
        assert description is not None
        last = action.option_strings[-1] if action.option_strings else action.dest.upper()
        listed = rf"{re.escape(last)}(?: \S+)? {re.escape(description)} \((?:[^()]*; )?env "
        assert re.search(listed, shown), f"{last} {description}"
    options = set(re.findall(r"(?<![\w-])--[a-z-]+", shown))
    assert set(EARLIER_FLAGS) <= options
    assert "--admin-token" not in options  # a secret is never asked for on a command line


def test_the_per_model_flags_are_a_group_of_their_own() -> None:
    groups = {g.title: {a.dest for a in g._group_actions} for g in serve_parser()._action_groups}
    per_model = set(config.ModelSettings.model_fields) - set(serve_command.NO_FLAG)
    assert groups["every model's settings"] == per_model
    assert not groups["server settings"] & per_model


def test_flags_not_given_are_none_so_env_and_file_apply() -> None:
    assert set(parse().values()) == {None}


def test_flags_beat_the_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("max_sequences: 7\nmax_batch_size: 8\nport: 9001\naccess_log: false\n")
    monkeypatch.setenv("RLSERVE_MAX_SEQUENCES", "9")
    monkeypatch.setenv("RLSERVE_PORT", "9002")
    monkeypatch.setenv("RLSERVE_ACCESS_LOG", "false")
    given = parse(
        "--config", str(file), "--max-sequences", "4", "--access-log",
        "--providers", "CUDAExecutionProvider", "--providers", "CPUExecutionProvider",
    )  # fmt: skip
    settings = config.load(**given)
    assert settings.max_sequences == 4  # flag over env and file
    assert settings.access_log is True  # a switch over env and file
    assert settings.port == 9002  # env over file
    assert settings.max_batch_size == 8  # file over default
    assert settings.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert settings.for_model({}).max_sequences == 4  # every model's default


def test_a_switch_turns_off_what_the_environment_turned_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLSERVE_PROXY_HEADERS", "true")
    assert config.load(**parse()).proxy_headers is True
    assert config.load(**parse("--no-proxy-headers")).proxy_headers is False


def test_the_positional_file_and_choices_keep_their_form() -> None:
    given = parse("m/1/model.onnx", "--observation-bounds", "clip", "--log-level", "debug")
    settings = config.load(**given)
    assert settings.model_file == Path("m/1/model.onnx")
    assert settings.observation_bounds is config.ObservationBounds.CLIP
    assert settings.log_level == "debug"
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--observation-bounds", "ignore"])


def test_flags_reach_gunicorn_workers_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """With --workers above 1 the flags become RLSERVE_* for gunicorn: the same settings."""
    given = parse(
        "--max-sequences", "3", "--no-access-log", "--allow-cpu-fallback",
        "--providers", "CPUExecutionProvider", "--observation-bounds", "reject",
        "--gpu-memory-limit-bytes", "1024", "--max-wait-ms", "2.5",
    )  # fmt: skip
    for name, value in production.environment(given).items():
        monkeypatch.setenv(name, value)
    assert config.load() == config.load(**given)


class _Unflaggable(BaseModel):
    token: SecretStr | None = Field(None, description="a secret")
    nested: config.VersionPolicy = Field(default_factory=config.VersionPolicy, description="x")
    plain: int = 3


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("token", "no command-line form"),
        ("nested", "no command-line form"),
        ("plain", "needs a description"),
    ],
)
def test_a_setting_without_a_command_line_form_or_a_help_is_refused(
    name: str, problem: str
) -> None:
    fields = {name: _Unflaggable.model_fields[name]}
    with pytest.raises(TypeError, match=problem):
        settings_arguments.add_settings(argparse.ArgumentParser(), fields, env_prefix="X_")
