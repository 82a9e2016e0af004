"""Settings precedence: flags > RLSERVE_* env > config file > defaults."""

from pathlib import Path

import pytest

from kernel.errors import ConfigError
from serve import config


def test_defaults_apply_when_nothing_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLSERVE_MAX_BATCH_SIZE", raising=False)
    assert config.load().max_batch_size == 32


def test_flags_beat_env_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("max_batch_size: 8\nmax_wait_ms: 5\nport: 9001\n")
    monkeypatch.setenv("RLSERVE_MAX_WAIT_MS", "7")
    monkeypatch.setenv("RLSERVE_PORT", "9002")
    settings = config.load(config_file=file, port=9003)
    assert (settings.max_batch_size, settings.max_wait_ms, settings.port) == (8, 7.0, 9003)


def test_the_config_file_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("max_queue_rows: 77\n")
    monkeypatch.setenv("RLSERVE_CONFIG_FILE", str(file))
    assert config.load().max_queue_rows == 77


def test_invalid_values_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="max_batch_size: Input should be greater than 0"):
        config.load(max_batch_size=0)


def test_unknown_settings_in_the_file_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("max_batch_sise: 8\n")
    with pytest.raises(ConfigError, match="max_batch_sise"):
        config.load(config_file=file)


def test_a_model_config_overrides_the_server_defaults_for_that_model(tmp_path: Path) -> None:
    model_config = tmp_path / "config.yaml"
    model_config.write_text("max_batch_size: 4\nversion_policy: {specific: [2, 3]}\n")
    settings = config.load(max_wait_ms=9).for_model(config.load_model_overrides(model_config))
    assert (settings.max_batch_size, settings.max_wait_ms) == (4, 9)
    assert settings.version_policy.specific == [2, 3]


def test_a_model_config_may_only_set_model_settings(tmp_path: Path) -> None:
    model_config = tmp_path / "config.yaml"
    model_config.write_text("port: 1\n")
    with pytest.raises(ConfigError, match="unknown settings \\['port'\\]"):
        config.load_model_overrides(model_config)


@pytest.mark.parametrize("token", ["", "   ", "\u00a0", "short-token", "a token with spaces!!"])
def test_an_admin_token_that_could_be_guessed_or_sent_empty_is_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="admin_token") as refused:
        config.load(admin_token=token)
    assert token.strip() == "" or token not in refused.value.message  # never echoed


def test_a_short_admin_token_is_refused_in_characters_with_what_would_do() -> None:
    with pytest.raises(ConfigError) as refused:
        config.load(admin_token="secret")
    message = refused.value.message
    assert "16 characters or more" in message
    assert "has 6" in message
    assert "openssl rand -hex 16" in message
    assert "items" not in message
    assert config.load(admin_token="s" * 16).admin_token is not None  # 16 is enough


def test_configuration_errors_never_echo_the_admin_token() -> None:
    with pytest.raises(ConfigError) as refused:
        config.load(admin_token="x" * 10, max_batch_size=0)
    assert "x" * 10 not in refused.value.message
    assert "max_batch_size" in refused.value.message


def test_grpc_needs_a_port_of_its_own() -> None:
    with pytest.raises(ConfigError, match="grpc_port 8000 is the HTTP port"):
        config.load(port=8000, grpc_port=8000)
    assert config.load(port=8000, grpc_port=8001).grpc_port == 8001
