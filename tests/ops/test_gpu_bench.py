"""bench/gpu.sh and python -m bench.gpu, on a machine without a GPU.

The script must refuse at once, saying why, before it installs anything. The Python module
is run for real against rlserve serve on the CPU provider (``--allow-cpu``): the fallback
check, the answer check and the load all run as on a GPU machine; only the provider differs.
Its pure parts (the answer comparison, the section-only rewrite) are checked on their own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import gpu, gpu_report, report
from tests.ops.conftest import REPO

NO_GPU = "no NVIDIA GPU"
CUDA_PATH = "this script measures the CUDA path; run it on a GPU machine"


def run_script(tmp_path: Path, path: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PATH": path, "GPU_VENV": str(tmp_path / "venv")}
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh")], env=env, capture_output=True, text=True,
        timeout=60, cwd=tmp_path,
    )  # fmt: skip
    return done, time.monotonic() - started


def test_the_script_refuses_at_once_where_there_is_no_nvidia_smi(tmp_path):
    path = "/usr/bin:/bin"
    if any(Path(p, "nvidia-smi").exists() for p in path.split(":")):
        pytest.skip("this machine has nvidia-smi")
    done, seconds = run_script(tmp_path, path)
    assert done.returncode == 2, done.stderr
    assert NO_GPU in done.stderr
    assert CUDA_PATH in done.stderr
    assert seconds < 10
    assert not (tmp_path / "venv").exists(), "nothing is installed without a GPU"


def test_the_script_refuses_when_nvidia_smi_lists_no_gpu(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    fake = tools / "nvidia-smi"  # what nvidia-smi says on a machine whose driver is not loaded
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
        "NVIDIA driver.'\nexit 9\n"
    )
    fake.chmod(0o755)
    done, seconds = run_script(tmp_path, f"{tools}:/usr/bin:/bin")
    assert done.returncode == 2, done.stderr
    assert NO_GPU in done.stderr
    assert CUDA_PATH in done.stderr
    assert seconds < 10
    assert not (tmp_path / "venv").exists()


STAND_IN = """#!/bin/sh
# nvidia-smi of a GPU machine, without the driver behind it
case "$*" in
  *--list-gpus*) echo "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)";;
  *--query-gpu=*) echo "Stand-in GPU, 0.0, 0 MiB";;
esac
"""


@pytest.mark.slow
def test_the_script_installs_the_gpu_wheel_and_fails_without_the_driver(tmp_path):
    """The install of a GPU machine, on this one (about 2.7 GB from PyPI, or pip's cache):
    behind a stand-in nvidia-smi the script installs onnxruntime-gpu as the image does, and
    the run fails because CUDA cannot load (no libcuda.so.1), saying so."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: run bench/gpu.sh itself")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(STAND_IN)
    (tools / "nvidia-smi").chmod(0o755)
    output = tmp_path / "gpu.md"
    env = {
        **os.environ,
        "PATH": f"{tools}:{os.environ['PATH']}",
        "GPU_VENV": str(tmp_path / "venv"),
    }
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh"), "--model", "mlp", "--batch", "1",
         "--seconds", "1", "--warmup", "0.5", "--output", str(output)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    pin = next(
        line.split("==")[1]
        for line in (REPO / "docker" / "constraints.txt").read_text().splitlines()
        if line.startswith("onnxruntime-gpu==")
    )
    assert f"bench/gpu.sh: onnxruntime {pin} " in done.stderr
    assert "'CUDAExecutionProvider'" in done.stderr
    section = output.read_text()
    assert "**Stand-in GPU**" in section
    assert "libcuda.so.1: cannot open shared object file" in section
    assert section.count("| pass |") == 2  # the fallback check, both ways
    venv_pip = [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "show"]
    assert subprocess.run([*venv_pip, "onnxruntime"], capture_output=True).returncode != 0
    assert subprocess.run([*venv_pip, "onnxruntime-gpu"], capture_output=True).returncode == 0


def test_the_module_refuses_without_a_gpu_unless_allowed(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--output", str(tmp_path / "out.md")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert NO_GPU in done.stderr
    assert "--allow-cpu" in done.stderr
    assert not (tmp_path / "out.md").exists()


def test_the_module_measures_the_cpu_provider_end_to_end(tmp_path):
    """Every step of a GPU run, on the CPU provider: a few seconds of real load."""
    document = tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", document)
    before = document.read_text()
    command = [
        sys.executable, "-m", "bench.gpu", "--provider", "CPUExecutionProvider", "--allow-cpu",
        "--model", "mlp", "--batch", "1", "--batch", "8", "--seconds", "1", "--warmup", "0.5",
        "--output", str(document),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    after = document.read_text()
    section = after[after.index(gpu_report.HEADING) :].split("\n## ", 1)[0]
    assert section.strip() in done.stdout  # printed as written
    lines = section.splitlines()
    fallback = [line for line in lines if line.startswith(("| false |", "| true |"))]
    assert len(fallback) == 2
    assert all(line.endswith("| pass |") for line in fallback)
    assert "is not running on requested ['CUDAExecutionProvider']" in fallback[0]
    assert "| CPUExecutionProvider | mlp: CPUExecutionProvider | yes |" in lines
    parity = [line for line in lines if line.startswith("| mlp | CPU | 16 |")]
    assert len(parity) == 1
    assert parity[0].endswith("| pass |")
    load = [
        line.split(" | ")
        for line in lines
        if line.startswith("| mlp | CPU | ") and line not in parity
    ]
    assert [row[2] for row in load] == ["1", "8"]
    for row in load:
        requests_per_s, rows_per_s = (float(row[i].replace(",", "")) for i in (4, 5))
        assert requests_per_s > 0
        # Hundreds of connections on a busy two-core machine may meet the server's own
        # overload answers (a full queue, a passed deadline); nothing else may go wrong.
        errors = re.fullmatch(r"(\d+)(?: \((.*)\))?", row[8])
        assert errors is not None, row[8]
        named = errors.group(2).split(", ") if errors.group(2) else []
        assert all(re.fullmatch(r"(429|504) x\d+", kind) for kind in named), row[8]
        assert (int(errors.group(1)) == 0) == (not named)
        assert rows_per_s == pytest.approx(requests_per_s * int(row[2]), rel=0.05)
    # Only the GPU section changed.
    assert _without_gpu_section(after) == _without_gpu_section(before)


def _without_gpu_section(document: str) -> str:
    start = document.find(gpu_report.HEADING)
    if start < 0:
        return document
    end = document.find("\n## ", start + 1)
    return document[:start] + (document[end + 1 :] if end >= 0 else "")


# ---------------------------------------------------------------------------- pure parts


def outputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, 6)).astype(np.float32)
    values = rng.standard_normal(rows).astype(np.float32)
    return {"action": logits.argmax(axis=1), "logits": logits, "value": values}


def served_from(expected: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "actions": expected["action"].copy(),
        "logits": expected["logits"].copy(),
        "values": expected["value"].copy(),
    }


def test_identical_answers_pass():
    expected = outputs(8)
    parity = gpu.compare("cnn", "CUDA", expected, served_from(expected), atol=1e-4)
    assert parity.passed, parity.problems
    assert parity.max_abs == {"logits": 0.0, "values": 0.0}
    assert (parity.discrete, parity.action_mismatches, parity.near_ties) == (True, 0, 0)


def test_a_value_further_off_than_the_tolerance_fails_and_is_named():
    expected = outputs(8)
    served = served_from(expected)
    served["values"][3] += 3e-4
    parity = gpu.compare("cnn", "CUDA", expected, served, atol=1e-4)
    assert not parity.passed
    assert parity.problems == ["values: differs from the CPU by 0.0003 (> 0.0001)"]
    assert parity.max_abs["values"] == pytest.approx(3e-4, rel=1e-2)


def test_a_different_action_counts_only_where_the_logits_decide():
    expected = outputs(8)
    expected["logits"][0, :2] = [2.0, 2.0 - 5e-5]  # a near tie: either action is right
    expected["logits"][0, 2:] = -1.0
    expected["action"][0] = 0
    served = served_from(expected)
    served["actions"][0] = 1
    tie = gpu.compare("cnn", "CUDA", expected, served, atol=1e-4)
    assert tie.passed
    assert (tie.action_mismatches, tie.near_ties) == (0, 1)
    served["actions"][5] = (expected["action"][5] + 1) % 6  # a clear winner missed
    clear = gpu.compare("cnn", "CUDA", expected, served, atol=1e-4)
    assert not clear.passed
    assert clear.action_mismatches == 1
    assert "actions: 1 of 8 differ" in clear.problems[0]


def test_a_shape_mismatch_fails():
    expected = outputs(8)
    served = served_from(expected)
    served["values"] = served["values"][:4]
    parity = gpu.compare("cnn", "CUDA", expected, served, atol=1e-4)
    assert parity.problems == ["values: shape (4,), CPU (8,)"]


def test_the_section_replaces_its_own_only():
    document = "# Benchmarks\n\n## A\n\na\n\n## Reading the numbers\n\nr\n"
    first = gpu_report.splice(document, f"{gpu_report.HEADING}\n\none\n")
    heading = gpu_report.HEADING
    assert (
        first == f"# Benchmarks\n\n## A\n\na\n\n{heading}\n\none\n\n## Reading the numbers\n\nr\n"
    )
    second = gpu_report.splice(first, f"{gpu_report.HEADING}\n\ntwo\n")
    assert second == first.replace("one", "two")
    alone = gpu_report.splice("# Benchmarks\n", f"{gpu_report.HEADING}\n\nx\n")
    assert alone == f"# Benchmarks\n\n{gpu_report.HEADING}\n\nx\n"


def test_a_document_written_without_a_gpu_keeps_the_gpu_section_it_had():
    measured = f"{gpu_report.HEADING}\n\nmeasured on a GPU\n\n"
    old = f"# Benchmarks\n\n## A\n\nold\n\n{measured}## Reading the numbers\n\nr\n"
    assert gpu_report.section_of(old) == measured
    assert gpu_report.section_of("# Benchmarks\n\n## A\n") is None
    new = gpu_report.splice(
        "# Benchmarks\n\n## A\n\nnew\n\n## Reading the numbers\n\nr\n", measured
    )
    assert gpu_report.section_of(new) == measured
    assert "new" in new
    assert "old" not in new


def test_connections_fill_a_batch_of_64_rows():
    assert [gpu.connections_for(rows) for rows in gpu.BATCHES] == [128, 16, 4, 4]


# What onnxruntime-gpu 1.31.1 logs on a machine without the driver or TensorRT (ANSI colours
# and all), as the server's log holds it.
ORT_LOG = (
    "\x1b[1;31m2026-12-01 22:11:28.18 [E:onnxruntime:Default, provider_bridge_ort.cc:2430 "
    "operator()] [ONNXRuntimeError] : 1 : FAIL : Failed to load library /venv/lib/python3.11/"
    "site-packages/onnxruntime/capi/libonnxruntime_providers_tensorrt.so with error: "
    "libnvinfer.so.10: cannot open shared object file: No such file or directory\n\x1b[m\n"
    "Falling back to ['CUDAExecutionProvider', 'CPUExecutionProvider'] and retrying.\n"
    "\x1b[1;31m2026-12-01 22:11:28.19 [E:onnxruntime:Default] FAIL : Failed to load library "
    "/venv/onnxruntime/capi/libonnxruntime_providers_cuda.so with error: libcuda.so.1: cannot "
    "open shared object file: No such file or directory\n\x1b[m\n"
)


def test_the_libraries_onnxruntime_could_not_load_are_read_from_the_log():
    assert gpu.load_errors(ORT_LOG + ORT_LOG) == [
        "libonnxruntime_providers_tensorrt.so: libnvinfer.so.10: cannot open shared object "
        "file: No such file or directory",
        "libonnxruntime_providers_cuda.so: libcuda.so.1: cannot open shared object file: No "
        "such file or directory",
    ]


def test_a_cuda_run_that_did_not_load_fails_the_run_and_tensorrts_does_not():
    results = gpu.GpuResults("now", gpu.Device("GPU", None, 1), "ort", "3.12", 16, 4, 1, 1e-4)
    results.runs = [gpu.ProviderRun([gpu.TENSORRT, gpu.CUDA], skipped="no libnvinfer")]
    assert results.passed
    results.runs.append(gpu.ProviderRun([gpu.CUDA], skipped="not running on CUDA"))
    assert not results.passed


def test_the_limit_check_wants_the_limit_and_the_strategy_where_cuda_runs():
    kept = {"gpu_mem_limit": str(256 << 20), "arena_extend_strategy": "kSameAsRequested"}
    defaults = {"gpu_mem_limit": "18446744073709551615", "arena_extend_strategy": "kNextPowerOfTwo"}
    on_cuda = [gpu.CUDA, gpu.CPU]
    assert gpu.LimitCheck([gpu.CUDA], 256 << 20, on_cuda, kept).passed
    assert not gpu.LimitCheck([gpu.CUDA], 256 << 20, on_cuda, defaults).passed
    cpu_only = gpu.LimitCheck([gpu.CUDA], 256 << 20, [gpu.CPU], {})
    assert cpu_only.passed
    assert not cpu_only.applies  # no CUDA here: reported as n/a, the CUDA run fails instead


def test_a_whole_run_keeps_the_figures_measured_in_tests_and_by_hand():
    measured = f"{report.MEASURED_IN_TESTS}\n\nfrom pytest -s\n\n"
    by_hand = f"{report.MEASURED_BY_HAND}\n\nfrom bench.predict_path\n\n"
    old = f"# Benchmarks\n\n## A\n\nold\n\n{measured}{by_hand}## Reading the numbers\n\nr\n"
    new = report.keep_sections("# Benchmarks\n\n## A\n\nnew\n\n## Reading the numbers\n\nr\n", old)
    kept = f"{measured}{by_hand}"
    assert new == f"# Benchmarks\n\n## A\n\nnew\n\n{kept}## Reading the numbers\n\nr\n"
    assert report.keep_sections("# Benchmarks\n\n## A\n\nnew\n", "# Benchmarks\n") == (
        "# Benchmarks\n\n## A\n\nnew\n"
    )
