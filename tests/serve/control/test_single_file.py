"""One exported file laid out as a one-model repository (serve.control.single_file)."""

import shutil
from pathlib import Path

import pytest

from kernel.errors import ConfigError
from serve import config
from serve.control import repository, single_file

DEMO_VERSION = Path(__file__).resolve().parents[3] / "examples/model_repository/cartpole/1"


@pytest.fixture
def version_dir(tmp_path: Path) -> Path:
    """An exporter's version directory: models/policy/7/model.onnx."""
    target = tmp_path / "models" / "policy" / "7"
    shutil.copytree(DEMO_VERSION, target)
    return target


def test_an_exported_version_directory_keeps_its_model_name_and_version(version_dir: Path) -> None:
    served = single_file.describe(version_dir / "model.onnx")
    assert (served.model, served.version, served.target) == ("policy", 7, version_dir.resolve())
    assert served.links_directory


def test_any_other_file_is_version_1_of_a_model_named_for_the_file(
    version_dir: Path, tmp_path: Path
) -> None:
    loose = tmp_path / "ppo.onnx"
    shutil.copy(version_dir / "model.onnx", loose)
    served = single_file.describe(loose)
    assert (served.model, served.version, served.links_directory) == ("ppo", 1, False)


def test_a_missing_file_is_refused_by_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model_file: .*nope\.onnx is not a file"):
        single_file.describe(tmp_path / "nope.onnx")


def test_the_repository_holds_the_one_version_and_names_the_default_model(
    version_dir: Path, tmp_path: Path
) -> None:
    loose = tmp_path / "ppo.onnx"
    shutil.copy(version_dir / "model.onnx", loose)
    settings = single_file.as_repository(config.load(model_file=loose))
    assert settings.default_model == "ppo"
    (only,) = repository.discover(settings.model_repository)["ppo"]
    assert only.version == 1
    assert only.path.read_bytes() == loose.read_bytes()
    again = single_file.as_repository(config.load(model_file=loose))  # a second worker
    assert again.model_repository == settings.model_repository


def test_a_version_directory_is_linked_whole(version_dir: Path) -> None:
    (version_dir / "tokenizer.json").write_text("{}")  # what a language model has beside it
    settings = single_file.as_repository(config.load(model_file=version_dir / "model.onnx"))
    (only,) = repository.discover(settings.model_repository)["policy"]
    assert only.version == 7
    assert (only.path.parent / "tokenizer.json").read_text() == "{}"


def test_without_a_file_the_settings_are_untouched() -> None:
    settings = config.load(model_repository=Path("somewhere"))
    assert single_file.as_repository(settings) is settings


@pytest.mark.parametrize("update", [{"admin_token": "t" * 20}, {"poll_interval_s": 1.0}])
def test_live_updates_are_refused_with_one_file(version_dir: Path, update: dict) -> None:
    settings = config.load(model_file=version_dir / "model.onnx", **update)
    (name,) = update
    with pytest.raises(ConfigError, match=f"{name} is set, but model_file .* read-only"):
        single_file.as_repository(settings)
