"""Checkpoints and statistics from someone else: nothing in them runs unless trusted.

Each poisoned file is a real checkpoint (or VecNormalize pickle) trained in the session,
with one pickled setting replaced by a payload that touches a marker file and then returns
a working value, so that the same file exports once trusted.
"""

from __future__ import annotations

import base64
import json
import pickle
import zipfile
from pathlib import Path

import pytest

from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.errors import ExportError
from export.sb3 import archive
from export.sb3.source import Sb3Options, load_source
from tests.export.export_policies import TrainedPolicy
from tests.export.test_export_cli import rlserve

_PICKLED = ":serialized:"


class _Payload:
    """Unpickles to ``eval(expression)``: code the file runs when it is unpickled."""

    def __init__(self, expression: str) -> None:
        self.expression = expression

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (self.expression,))


def _payload(marker: Path, value: str) -> bytes:
    touch = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    return pickle.dumps(_Payload(f"({touch}, {value})[1]"))


def _poisoned(checkpoint: Path, key: str, marker: Path, out: Path) -> Path:
    """A copy of the checkpoint whose ``data[key]`` runs the payload (and keeps its value)."""
    with zipfile.ZipFile(checkpoint) as source:
        entries = {info.filename: source.read(info) for info in source.infolist()}
    data = json.loads(entries[archive.SETTINGS_ENTRY])
    kept = data.get(key)
    if isinstance(kept, dict) and _PICKLED in kept:
        value = f"__import__('pickle').loads({base64.b64decode(kept[_PICKLED])!r})"
    else:
        value = repr(kept)
    blob = _payload(marker, value)
    data[key] = {_PICKLED: base64.b64encode(blob).decode("ascii")}
    entries[archive.SETTINGS_ENTRY] = json.dumps(data).encode()
    with zipfile.ZipFile(out, "w") as target:
        for name, content in entries.items():
            target.writestr(name, content)
    return out


@pytest.mark.parametrize("key", ["clip_range", "observation_space", "lr_schedule", "notes"])
def test_a_payload_under_any_key_is_refused_by_name_and_never_runs(
    cartpole_ppo: TrainedPolicy, tmp_path: Path, key: str
) -> None:
    marker = tmp_path / "ran"
    poisoned = _poisoned(cartpole_ppo.checkpoint, key, marker, tmp_path / "poisoned.zip")
    with pytest.raises(ExportError) as refused:
        load_source(Sb3Options(poisoned))
    message = refused.value.message
    assert f"data['{key}'] is a pickle that names builtins.eval" in message
    assert "nothing in it ran" in message
    assert "--trust-checkpoint" in message
    assert not marker.exists()


def test_a_trusted_checkpoint_is_unpickled_as_sb3_does(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    poisoned = _poisoned(cartpole_ppo.checkpoint, "clip_range", marker, tmp_path / "p.zip")
    source = load_source(Sb3Options(poisoned, trust_checkpoint=True))
    destination = writer.destination(tmp_path / "models", "trusted", None)
    outcome = export_policy(source, ParitySettings(), destination, lambda _: None)
    assert outcome.path is not None, outcome.report.table()
    assert marker.exists()  # trusting it is what lets its code run, once


def test_the_cli_refuses_untrusted_then_exports_with_trust_checkpoint(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    poisoned = _poisoned(cartpole_ppo.checkpoint, "observation_space", marker, tmp_path / "p.zip")
    repository = tmp_path / "models"
    arguments = ("export", "sb3", poisoned, "--name", "m", "--model-repository", repository)
    refused = rlserve(*arguments)
    assert refused.returncode == 2, refused.stderr
    assert "data['observation_space'] is a pickle that names builtins.eval" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not marker.exists()
    assert not repository.exists()
    trusted = rlserve(*arguments, "--trust-checkpoint")
    assert trusted.returncode == 0, trusted.stderr
    assert "parity PASSED" in trusted.stdout
    assert marker.exists()


def test_a_custom_policy_class_is_named_with_the_way_to_trust_it(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    poisoned = _poisoned(cartpole_ppo.checkpoint, "policy_class", marker, tmp_path / "p.zip")
    with pytest.raises(ExportError, match=r"unsupported policy class eval; .*--trust-checkpoint"):
        load_source(Sb3Options(poisoned))
    assert not marker.exists()


def test_poisoned_vecnormalize_statistics_are_refused_unless_trusted(
    pendulum_vecnormalize: TrainedPolicy, tmp_path: Path
) -> None:
    assert pendulum_vecnormalize.vecnormalize is not None
    marker = tmp_path / "ran"
    real = pendulum_vecnormalize.vecnormalize.read_bytes()
    stats = tmp_path / "stats.pkl"
    stats.write_bytes(_payload(marker, f"__import__('pickle').loads({real!r})"))
    options = Sb3Options(pendulum_vecnormalize.checkpoint, vecnormalize=stats)
    with pytest.raises(ExportError, match=r"names builtins\.eval.*--trust-checkpoint"):
        load_source(options)
    assert not marker.exists()
    load_source(
        Sb3Options(pendulum_vecnormalize.checkpoint, vecnormalize=stats, trust_checkpoint=True)
    )
    assert marker.exists()


def _bomb(checkpoint: Path, entry: str, inflated: int, out: Path) -> Path:
    """The checkpoint with ``entry`` replaced by ``inflated`` zero bytes, deflated."""
    with zipfile.ZipFile(checkpoint) as source:
        entries = {info.filename: source.read(info) for info in source.infolist()}
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for name, content in entries.items():
            if name != entry:
                target.writestr(name, content)
        with target.open(entry, "w", force_zip64=True) as bomb:
            chunk = bytes(1 << 20)
            for _ in range(inflated >> 20):
                bomb.write(chunk)
    return out


@pytest.mark.parametrize(
    ("entry", "inflated", "says"),
    [
        ("data", 96 << 20, "the zip's 'data' entry would inflate to 96.0 MiB"),
        ("policy.pth", 200 << 20, "'policy.pth' alone to 200.0 MiB"),
    ],
)
def test_a_zip_bomb_is_refused_before_it_is_inflated(
    cartpole_ppo: TrainedPolicy, tmp_path: Path, entry: str, inflated: int, says: str
) -> None:
    bomb = _bomb(cartpole_ppo.checkpoint, entry, inflated, tmp_path / "bomb.zip")
    assert bomb.stat().st_size < inflated // 100
    with pytest.raises(ExportError, match="refusing to inflate") as refused:
        load_source(Sb3Options(bomb))
    assert says in refused.value.message
    with pytest.raises(ExportError, match="refusing to inflate"):
        load_source(Sb3Options(bomb, trust_checkpoint=True))  # trust is about code, not size
