"""observation_bounds: a server default (flag, RLSERVE_OBSERVATION_BOUNDS, file) that a
model's own config.yaml may override."""

from pathlib import Path

import pytest

from kernel.errors import ConfigError
from kernel.spaces import ObservationBounds
from serve import config


def test_values_outside_the_bounds_are_allowed_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLSERVE_OBSERVATION_BOUNDS", raising=False)
    settings = config.load()
    assert settings.observation_bounds is ObservationBounds.ALLOW
    assert settings.for_model({}).observation_bounds is ObservationBounds.ALLOW


def test_the_environment_sets_the_default_and_a_model_config_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSERVE_OBSERVATION_BOUNDS", "clip")
    settings = config.load()
    assert settings.for_model({}).observation_bounds is ObservationBounds.CLIP
    model = tmp_path / "config.yaml"
    model.write_text("observation_bounds: reject\n")
    overridden = settings.for_model(config.load_model_overrides(model))
    assert overridden.observation_bounds is ObservationBounds.REJECT


def test_an_unknown_mode_names_the_setting_and_the_choices() -> None:
    with pytest.raises(ConfigError) as refused:
        config.load(observation_bounds="ignore")
    assert "observation_bounds: Input should be 'reject', 'clip' or 'allow'" in str(refused.value)
