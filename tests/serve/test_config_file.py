"""The config file: settings by name, and the service guide's ``service:``/``model:``
sections (configs/service_config.yaml is the guide's file, verbatim)."""

from pathlib import Path

import pytest

from kernel.errors import ConfigError
from serve import config

ROOT = Path(__file__).resolve().parents[2]
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
REFERENCE = Path(__file__).with_name("reference")  # the guide's answer shapes (health.json)
CONFIGS = ROOT / "configs"  # the deployment guides' files, as written


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "WORKERS", "HOST", "MAX_BATCH_SIZE", "MODEL_FILE", "CONFIG_FILE"):
        monkeypatch.delenv(config.ENV_PREFIX + name, raising=False)


@pytest.mark.parametrize(
    "copy", [CONFIGS / "service_config.yaml", REFERENCE / "health.json"], ids=lambda p: p.name
)
def test_the_copies_of_the_reference_files_are_verbatim(copy: Path) -> None:
    if not SHARED_REFERENCE.is_dir():
        pytest.skip(f"{SHARED_REFERENCE} (the shared reference shapes) is not on this machine")
    assert copy.read_bytes() == (SHARED_REFERENCE / copy.name).read_bytes()


def test_the_service_guides_file_loads_unchanged() -> None:
    settings = config.load(config_file=CONFIGS / "service_config.yaml")
    assert settings.port == 8080
    assert settings.workers == 4
    assert settings.model_file == Path("/models/ppo.onnx")
    assert settings.max_batch_size == 32


def test_sections_and_settings_by_name_mix(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("service: {host: 0.0.0.0}\nmodel: {batch_size: 8}\nmax_wait_ms: 2\n")
    settings = config.load(config_file=file)
    assert (settings.host, settings.max_batch_size, settings.max_wait_ms) == ("0.0.0.0", 8, 2.0)


def test_flags_and_env_outrank_the_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSERVE_WORKERS", "3")
    settings = config.load(config_file=CONFIGS / "service_config.yaml", port=9000)
    assert (settings.port, settings.workers) == (9000, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("service: {port: 1, threads: 4}\n", r"service\.threads is not a setting; service may "
         r"hold \['host', 'port', 'workers'\]"),
        ("model: {path: a.onnx, name: ppo}\n", r"model\.name is not a setting; model may hold "
         r"\['batch_size', 'path'\]"),
        ("model: {batch_size: 8}\nmax_batch_size: 16\n", "max_batch_size is set twice, as "
         "model.batch_size and as max_batch_size; keep one"),
        ("service: 8080\n", "service must be a mapping with any of"),
        ("- port\n", r"c\.yaml: expected a mapping of settings, got list"),
        ("service: {port: [1\n", r"c\.yaml: not valid YAML \(.*line 1"),
        ("model: {batch_size: 0}\n", r"max_batch_size: Input should be greater than 0 \(got 0\)"),
    ],
)  # fmt: skip
def test_a_wrong_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(config_file=file)
