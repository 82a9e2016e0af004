"""The rlserve CLI end to end: export, inspect and verify as a user runs them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import cli
from tests.export import cleanrl_agents
from tests.export.export_policies import TrainedPolicy

RLSERVE = Path(sys.executable).parent / "rlserve"


def rlserve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RLSERVE), *map(str, args)], capture_output=True, text=True, timeout=240, check=False
    )


def test_export_sb3_then_inspect_then_verify(cartpole_ppo: TrainedPolicy, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    done = rlserve(
        "export",
        "sb3",
        cartpole_ppo.checkpoint,
        "--name",
        "cartpole",
        "--model-repository",
        repository,
    )
    model = repository / "cartpole" / "1" / "model.onnx"
    assert done.returncode == 0, done.stderr
    assert "parity PASSED" in done.stdout
    assert "log_prob" in done.stdout
    assert done.stdout.strip().endswith(f"wrote {model}")
    # every stage says how long the one before it took, and the last the whole export's
    assert re.search(r"rlserve export: \[\+[0-9.]+ s\] checking parity on 256", done.stderr)
    assert re.search(r"rlserve export: \[\+[0-9.]+ s\] done in [0-9.]+ s\n", done.stderr)
    inspected = rlserve("inspect", model)
    assert inspected.returncode == 0, inspected.stderr
    assert "algorithm       ppo (actor_critic)" in inspected.stdout
    assert "distribution    categorical" in inspected.stdout
    verified = rlserve("verify", model)
    assert verified.returncode == 0, verified.stderr
    assert "OK, 4 golden vectors reproduced" in verified.stdout


def test_export_torch_from_a_file_with_json_spaces(tmp_path: Path) -> None:
    done = rlserve(
        "export",
        "torch",
        f"{cleanrl_agents.__file__}:make_pendulum_agent",
        "--observation-space",
        '{"type": "Box", "shape": [3], "low": -8, "high": 8}',
        "--action-space",
        '{"type": "Box", "shape": [1], "low": -2, "high": 2}',
        "--name",
        "pendulum",
        "--model-repository",
        tmp_path,
        "--version",
        "3",
    )
    assert done.returncode == 0, done.stderr
    assert rlserve("verify", tmp_path / "pendulum" / "3" / "model.onnx").returncode == 0


def test_a_missing_checkpoint_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = rlserve(
        "export",
        "sb3",
        tmp_path / "nothere.zip",
        "--name",
        "x",
        "--model-repository",
        tmp_path / "m",
    )
    assert done.returncode == 2
    assert _error_line(done.stderr).endswith(
        "give the .zip written by Stable-Baselines3's model.save()"
    )
    assert not (tmp_path / "m").exists()


def test_a_name_too_long_exits_2_with_what_a_name_may_be_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It reached the writer, whose OSError (file name too long) left a traceback and exit 1.
    repository = tmp_path / "m"
    status = cli.main(
        ["export", "sb3", str(tmp_path / "nothere.zip"), "--name", "n" * 300,
         "--model-repository", str(repository)]
    )  # fmt: skip
    line = _error_line(capsys.readouterr().err)
    assert status == 2
    assert "--name 'nnnnnnnnnnnnnnnnnnnn'... (300 characters): a model name is 1 to 128" in line
    assert not repository.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a zip at all", "not a readable Stable-Baselines3 checkpoint"),
        (b"PK\x03\x04 truncated", "not a readable Stable-Baselines3 checkpoint"),
    ],
)
def test_a_corrupt_zip_exits_2_and_writes_nothing(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.zip"
    bad.write_bytes(content)
    status = cli.main(
        ["export", "sb3", str(bad), "--name", "x", "--model-repository", str(tmp_path / "m")]
    )
    assert status == 2
    assert message in _error_line(capsys.readouterr().err)
    assert not (tmp_path / "m").exists()


def test_a_model_trained_under_vecnormalize_needs_its_stats_or_no_normalize(
    pendulum_vecnormalize: TrainedPolicy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "export",
        "sb3",
        str(pendulum_vecnormalize.checkpoint),
        "--name",
        "p",
        "--model-repository",
        str(tmp_path),
    ]
    assert cli.main(argv) == 2
    line = _error_line(capsys.readouterr().err)
    assert "trained under VecNormalize" in line
    assert "--vecnormalize STATS.pkl" in line
    assert "--no-normalize" in line
    assert not (tmp_path / "p").exists()
    assert cli.main([*argv, "--no-normalize"]) == 0
    assert (tmp_path / "p" / "1" / "model.onnx").is_file()


def test_an_existing_version_is_refused(
    cartpole_ppo: TrainedPolicy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cartpole" / "1").mkdir(parents=True)
    argv = [
        "export",
        "sb3",
        str(cartpole_ppo.checkpoint),
        "--name",
        "cartpole",
        "--model-repository",
        str(tmp_path),
        "--version",
        "1",
    ]
    assert cli.main(argv) == 2
    assert "already exists" in _error_line(capsys.readouterr().err)
    assert list((tmp_path / "cartpole" / "1").iterdir()) == []


def test_an_onnx_file_without_a_contract_exits_2_for_inspect_and_verify(tmp_path: Path) -> None:
    plain = tmp_path / "plain.onnx"
    onnx.save(_identity_model(), plain)
    for command in ("inspect", "verify"):
        done = rlserve(command, plain)
        assert done.returncode == 2
        assert "has no policy contract" in _error_line(done.stderr)
        assert "rlserve export" in _error_line(done.stderr)


SHOWN = {"maskable_ppo": "MaskablePPO", "recurrent_ppo": "RecurrentPPO", "qrdqn": "QR-DQN"}


def test_export_help_names_every_algorithm_it_exports() -> None:
    """`rlserve --help` and `rlserve export --help` name every family the sb3 source takes."""
    from export.sb3.checkpoint import PolicyFamily

    for args in (("--help",), ("export", "--help")):
        done = rlserve(*args)
        shown = " ".join(done.stdout.split())  # argparse wraps lines
        for family in PolicyFamily:
            for algorithm in family.algorithms:
                name = SHOWN.get(algorithm.value, algorithm.value.upper())
                assert name in shown, (args, name)


def test_export_help_explains_every_option() -> None:
    done = rlserve("export", "sb3", "--help")
    assert done.returncode == 0
    for flag in (
        "--vecnormalize",
        "--no-normalize",
        "--name",
        "--model-repository",
        "--version",
        "--algorithm",
        "--image-layout",
        "--tolerance",
        "--parity-samples",
        "--parity-observations",
        "--seed",
    ):
        assert flag in done.stdout


def _error_line(stderr: str) -> str:
    """The error: the last line, the only one that is not progress, and no traceback."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    assert lines[-1].startswith("rlserve ")
    assert ": error: " in lines[-1]
    assert all(line.startswith("rlserve export: ") for line in lines[:-1])
    return lines[-1]


def _identity_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("obs", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("action", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["obs"], ["action"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
