"""The generation metrics: what decoding steps report becomes Prometheus series by model."""

from __future__ import annotations

from prometheus_client import generate_latest

from serve.lm.metrics import GenerationMetrics
from serve.lm.scheduling.generation_record import StepRecord
from serve.metrics import Metrics


def sample(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


def test_steps_become_tokens_latencies_occupancy_and_cache_bytes():
    metrics = Metrics()
    generation = GenerationMetrics(metrics)
    generation.accept_step(
        StepRecord("lm", (3, 4), 4096, 9, 20, (0.01, 0.02), (0.001,) * 7, ((1, 0.5),))
    )
    generation.accept_step(StepRecord("lm", (1,), 1024, 1, 0, (), (0.002,), ((2, 1.5),)))
    generation.flush()
    text = generate_latest(metrics.registry).decode()
    assert sample(text, 'rlserve_lm_generated_tokens_total{model="lm"}') == 10
    assert sample(text, 'rlserve_lm_prompt_tokens_total{model="lm"}') == 20
    assert sample(text, 'rlserve_lm_time_to_first_token_seconds_count{model="lm"}') == 2
    assert sample(text, 'rlserve_lm_inter_token_latency_seconds_count{model="lm"}') == 8
    assert sample(text, 'rlserve_lm_step_sequences_count{model="lm"}') == 3
    assert sample(text, 'rlserve_lm_step_sequences_sum{model="lm"}') == 8
    assert sample(text, 'rlserve_lm_kv_cache_bytes{model="lm"}') == 1024
    assert sample(text, 'rlserve_requests_total{model="lm",status="200",version="1"}') == 1
    assert sample(text, 'rlserve_requests_total{model="lm",status="200",version="2"}') == 1
    assert sample(text, 'rlserve_request_latency_seconds_count{model="lm"}') == 2
    metrics.flush()  # nothing new: nothing counted twice
    again = generate_latest(metrics.registry).decode()
    assert sample(again, 'rlserve_lm_generated_tokens_total{model="lm"}') == 10
