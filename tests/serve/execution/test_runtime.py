"""onnxruntime sessions: provider options from the settings, and the two ways a batch runs
(``session.run`` on the CPU, an I/O binding on GPU providers) giving the same answers.

The binding path is forced on the CPU provider here (onnxruntime binds CPU tensors too), on
the benchmark's mlp (Box actions) and cnn (uint8 frames, Discrete actions) and the bundled
CartPole demo (Discrete), against ``session.run`` on the same rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from bench import gpu_models
from kernel.errors import ConfigError
from serve import config
from serve.commands import serve as serve_command
from serve.execution import runtime
from serve.execution.runtime import CPU, CUDA, TENSORRT, Execution

CARTPOLE = Path(__file__).parents[3] / "examples" / "model_repository" / "cartpole" / "1"


def test_a_memory_limit_reaches_the_cuda_arena_and_the_tensorrt_workspace():
    settings = config.load(providers=[TENSORRT, CUDA, CPU], gpu_memory_limit_bytes=2 << 30)
    providers = runtime.session_providers(runtime.requested_providers(settings), settings)
    assert providers == [
        (TENSORRT, {"trt_max_workspace_size": "2147483648"}),
        (CUDA, {"gpu_mem_limit": "2147483648", "arena_extend_strategy": "kSameAsRequested"}),
        (CPU, {}),
    ]


def test_without_a_limit_every_provider_keeps_onnxruntimes_defaults():
    settings = config.load(providers=[CUDA, CPU])
    assert runtime.session_providers(runtime.requested_providers(settings), settings) == [
        (CUDA, {}),
        (CPU, {}),
    ]


def test_the_limit_comes_from_the_environment_and_must_be_positive(monkeypatch):
    monkeypatch.setenv("RLSERVE_GPU_MEMORY_LIMIT_BYTES", "1073741824")
    assert config.load().gpu_memory_limit_bytes == 1 << 30
    monkeypatch.setenv("RLSERVE_GPU_MEMORY_LIMIT_BYTES", "0")
    with pytest.raises(ConfigError, match=r"gpu_memory_limit_bytes.*greater than 0"):
        config.load()


def test_the_serve_flag_sets_the_limit():
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    namespace = parser.parse_args(["--gpu-memory-limit-bytes", "536870912"])
    overrides = serve_command.settings_given(namespace)
    assert config.load(**overrides).gpu_memory_limit_bytes == 512 << 20


def test_a_cuda_request_with_a_limit_builds_and_reports_the_fallback_honestly():
    settings = config.load(providers=[CUDA, CPU], gpu_memory_limit_bytes=1 << 30)
    session = runtime.create_session(CARTPOLE / "model.onnx", settings, "cartpole/1")
    assert session.report.active == (CPU,)  # no CUDA on this machine
    assert session.report.missing == (CUDA,)
    assert session.execution is Execution.RUN  # batches run where the session runs
    assert list(session.provider_options()) == [CPU]


def test_a_limit_lost_in_onnxruntimes_own_fallback_is_noticed():
    """TensorRT failing as a session is built: onnxruntime rebuilds it on CUDA and the CPU
    with no options at all (what get_provider_options then reports is CUDA's defaults)."""
    settings = config.load(providers=[TENSORRT, CUDA, CPU], gpu_memory_limit_bytes=1 << 30)
    wanted = runtime.provider_options(settings)
    defaults = {"gpu_mem_limit": "18446744073709551615", "arena_extend_strategy": "kNextPowerOfTwo"}
    kept = {"gpu_mem_limit": "1073741824", "arena_extend_strategy": "kSameAsRequested"}
    active = [CUDA, CPU]
    assert runtime.lost_options(active, {CUDA: defaults, CPU: {}}, wanted) == [CUDA]
    assert runtime.lost_options(active, {CUDA: kept, CPU: {}}, wanted) == []
    assert runtime.lost_options([CPU], {CPU: {}}, wanted) == []
    assert runtime.lost_options(active, {CUDA: defaults, CPU: {}}, {}) == []  # no limit set


def test_gpu_providers_run_through_a_binding_and_the_cpu_through_session_run():
    assert Execution.for_provider(CUDA) is Execution.BOUND
    assert Execution.for_provider(TENSORRT) is Execution.BOUND
    assert Execution.for_provider(CPU) is Execution.RUN


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    root = gpu_models.build_repository(tmp_path_factory.mktemp("runtime-models"))
    found = {
        m.name: (root / m.name / "1" / "model.onnx", m.observations(9, seed=3))
        for m in gpu_models.MODELS
    }
    rows = np.random.default_rng(3).standard_normal((9, 4)).astype(np.float32)
    found["cartpole"] = (CARTPOLE / "model.onnx", rows)
    return found


@pytest.mark.parametrize("name", ["mlp", "cnn", "cartpole"])
@pytest.mark.parametrize("rows", [1, 9])
def test_the_binding_answers_exactly_what_session_run_answers(models, name, rows):
    path, observations = models[name]
    settings = config.load(providers=[CPU])
    plain = runtime.create_session(path, settings, name)
    bound = runtime.create_session(path, settings, name, execution=Execution.BOUND)
    assert (plain.execution, bound.execution) == (Execution.RUN, Execution.BOUND)
    feeds = {"obs": observations[:rows]}
    expected, got = plain.run(feeds), bound.run(feeds)
    assert list(got) == list(expected) == plain.output_names
    for output in expected:
        assert got[output].dtype == expected[output].dtype, output
        assert got[output].shape[0] == rows, output
        np.testing.assert_array_equal(got[output], expected[output], err_msg=output)


def test_the_binding_takes_non_contiguous_rows(models):
    path, observations = models["mlp"]
    settings = config.load(providers=[CPU])
    bound = runtime.create_session(path, settings, "mlp", execution=Execution.BOUND)
    plain = runtime.create_session(path, settings, "mlp")
    every_other = observations[::2]  # a strided view, as a padded or sliced batch can be
    np.testing.assert_array_equal(
        bound.run({"obs": every_other})["mean"],
        plain.run({"obs": np.ascontiguousarray(every_other)})["mean"],
    )


def test_a_bound_run_reads_and_writes_the_callers_arrays_in_place(models):
    path, observations = models["mlp"]
    settings = config.load(providers=[CPU])
    session = runtime.create_session(path, settings, "mlp")
    assert session.binder is not None  # the CPU provider binds host arrays
    expected = session.run({"obs": observations[:4]})
    rows = np.ascontiguousarray(observations[:4])
    outputs = {name: np.zeros_like(expected[name]) for name in session.output_names}
    run = session.bind({"obs": rows}, outputs)
    run()
    for name in session.output_names:
        np.testing.assert_array_equal(outputs[name], expected[name], err_msg=name)
    rows[:] = observations[4:8]  # the same arrays, new rows: no binding again
    run()
    np.testing.assert_array_equal(outputs["mean"], session.run({"obs": observations[4:8]})["mean"])
    with pytest.raises(ValueError, match="C-contiguous"):
        session.bind({"obs": observations[:8:2]}, outputs)


def test_a_session_on_a_gpu_provider_offers_no_binder(models):
    path, _ = models["mlp"]
    settings = config.load(providers=[CPU])
    bound = runtime.create_session(path, settings, "mlp", execution=Execution.BOUND)
    assert bound.binder is None  # its arrays would be device memory, not the caller's
