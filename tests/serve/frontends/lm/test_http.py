"""Which paths the language-model frontend answers."""

from __future__ import annotations

import pytest

from serve.frontends.lm.http import Action, GeneratePath, match


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/models/m/generate", GeneratePath("m", None, Action.GENERATE)),
        ("/v1/models/m/score", GeneratePath("m", None, Action.SCORE)),
        ("/v1/models/m/versions/3/generate", GeneratePath("m", "3", Action.GENERATE)),
        ("/v1/models/m/versions/3/score", GeneratePath("m", "3", Action.SCORE)),
        ("/v1/models/m/predict", None),
        ("/v1/models//generate", None),
        ("/v1/models/m/versions//score", None),
        ("/v1/models/m/generate/x", None),
        ("/v1/completions", None),
        ("/generate", None),
    ],
)
def test_paths(path, expected):
    assert match(path) == expected
