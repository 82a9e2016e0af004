"""The one YAML config-file loader (cli/config_file.py) the server and the loop share: a file
that is missing, not YAML or not a mapping is refused naming the file and the fix; files
merge in order, a later one winning section by section; a mapping is a settings source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cli.config_file import MappingSource, merged, read
from kernel.errors import ConfigError

ENV_PREFIX = "RLSERVE_CLI_TEST_"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        read(path)
    return caught.value.message


# -- one file ---------------------------------------------------------------------------------


def test_a_file_is_read_as_its_mapping(tmp_path):
    path = write(tmp_path, "port: 9000\nsync_policy: {max_staleness: 8}\n")
    assert read(path) == {"port": 9000, "sync_policy": {"max_staleness": 8}}


@pytest.mark.parametrize("text", ["", "# nothing set yet\n", "---\n"])
def test_an_empty_file_sets_nothing(tmp_path, text):
    assert read(write(tmp_path, text)) == {}


def test_a_missing_file_is_named_with_what_to_give(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert refused(missing) == (
        f"config_file: {missing} does not exist; give the path of a YAML file"
    )


def test_a_directory_is_no_file(tmp_path):
    assert f"config_file: {tmp_path} does not exist" in refused(tmp_path)


def test_a_file_that_is_not_yaml_is_named_with_the_parsers_words_on_one_line(tmp_path):
    path = write(tmp_path, "cluster_mode: [decoupled\n")
    message = refused(path)
    assert message.startswith(f"{path}: not valid YAML (")
    assert "line 1" in message  # the parser's place, so a person can find it
    assert "correct it where the parser points" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "kind"), [("- port\n- 9000\n", "list"), ("just words\n", "str"), ("7\n", "int")]
)
def test_a_file_that_is_not_a_mapping_is_named_with_what_it_holds(tmp_path, text, kind):
    path = write(tmp_path, text)
    message = refused(path)
    assert message.startswith(f"{path}: expected a mapping of settings, got {kind}; ")
    assert "'name: value'" in message


# -- several files ----------------------------------------------------------------------------


def test_a_later_layer_wins_section_by_section():
    first = {"cluster_mode": "co-located", "data_buffer": {"type": "kafka", "topic": "a"}}
    second = {"data_buffer": {"topic": "b"}, "rollout": {"seed": 1}}
    third = {"cluster_mode": "decoupled"}
    assert merged([first, second, third]) == {
        "cluster_mode": "decoupled",
        "data_buffer": {"type": "kafka", "topic": "b"},
        "rollout": {"seed": 1},
    }
    assert merged([third, second, first])["cluster_mode"] == "co-located"


def test_sections_merge_at_every_depth_and_a_value_replaces_a_section():
    base = {"trainer": {"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "epochs": 3}}
    top = {"trainer": {"optimizer": {"lr": 0.01}, "epochs": None}}
    assert merged([base, top]) == {
        "trainer": {"optimizer": {"lr": 0.01, "betas": [0.9, 0.99]}, "epochs": None}
    }
    assert merged([base, {"trainer": "none"}]) == {"trainer": "none"}
    assert merged([{"trainer": "none"}, base]) == base


def test_merging_changes_none_of_the_layers():
    base = {"data_buffer": {"topic": "a"}}
    merged([base, {"data_buffer": {"topic": "b"}}])
    assert base == {"data_buffer": {"topic": "a"}}


def test_no_layers_merge_into_no_settings():
    assert merged([]) == {}


def test_files_merge_in_the_order_given(tmp_path):
    first = write(tmp_path, "data_buffer: {type: kafka, partition: 4}\n", "first.yaml")
    second = write(tmp_path, "data_buffer: {partition: 8}\n", "second.yaml")
    assert merged(read(p) for p in (first, second)) == {
        "data_buffer": {"type": "kafka", "partition": 8}
    }


def test_the_first_bad_file_in_order_is_the_one_named(tmp_path):
    good = write(tmp_path, "port: 1\n", "good.yaml")
    listed = write(tmp_path, "- port\n", "listed.yaml")
    with pytest.raises(ConfigError, match=r"listed\.yaml: expected a mapping"):
        merged(read(p) for p in (good, listed, tmp_path / "missing.yaml"))


# -- as a settings source ---------------------------------------------------------------------


class Batching(BaseModel):
    size: int = 32
    wait_ms: float = 1.0


def settings_over(values: dict[str, Any]) -> type[BaseSettings]:
    """Settings whose sources are flags (keyword arguments), the environment, ``values``."""

    class Settings(BaseSettings):
        model_config = SettingsConfigDict(
            env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid"
        )
        port: int = 8000
        host: str = "127.0.0.1"
        batching: Batching = Batching()

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, MappingSource(settings_cls, values)

    return Settings


def test_a_mapping_source_sits_below_flags_and_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_PREFIX + "HOST", "0.0.0.0")
    monkeypatch.setenv(ENV_PREFIX + "BATCHING__WAIT_MS", "5")
    settings_cls: Any = settings_over({"port": 9000, "host": "10.0.0.1", "batching": {"size": 8}})
    settings = settings_cls(port=9001)
    assert (settings.port, settings.host) == (9001, "0.0.0.0")
    assert settings.batching == Batching(size=8, wait_ms=5.0)  # a section merges with env
    assert settings_cls().port == 9000


def test_a_mapping_source_takes_names_exactly_as_written():
    with pytest.raises(ValidationError, match="PORT"):
        settings_over({"PORT": 9000})()
    with pytest.raises(ValidationError, match="max_batch_sise"):
        settings_over({"max_batch_sise": 8})()
