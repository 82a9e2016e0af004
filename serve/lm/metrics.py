"""A language model's metrics: what its decoding steps report, as Prometheus series by model.

The continuous-batching scheduler's sink (``serve.lm.scheduling.generation_record``),
registered by the language-model kind (``serve.lm.plugin``) in the server's one registry.
Like the batch records' sink, a step's record only adds to tallies; :meth:`flush` moves them
into the metrics (at a scrape, and when the load gauges are sampled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from serve.lm.scheduling.generation_record import StepRecord
from serve.metrics import LATENCY_BUCKETS, ROW_BUCKETS, Metrics, Tally


class GenerationMetrics:
    """Tokens, prompt tokens, time to first token, inter-token latency, batch occupancy
    and key/value cache bytes, by model; answered requests go to the shared series."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._models: dict[str, _ModelTally] = {}
        self.generated_tokens = Counter(
            "rlserve_lm_generated_tokens", "Tokens generated (its rate: tokens/s)", ["model"],
            registry=metrics.registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "rlserve_lm_prompt_tokens",
            "Prompt tokens prefilled or scored",
            ["model"],
            registry=metrics.registry,
        )
        self.time_to_first_token = Histogram(
            "rlserve_lm_time_to_first_token_seconds",
            "From a generate request's arrival to its first token",
            ["model"], buckets=LATENCY_BUCKETS, registry=metrics.registry,
        )  # fmt: skip
        self.inter_token = Histogram(
            "rlserve_lm_inter_token_latency_seconds",
            "Between a sequence's consecutive tokens", ["model"], buckets=LATENCY_BUCKETS,
            registry=metrics.registry,
        )  # fmt: skip
        self.step_sequences = Histogram(
            "rlserve_lm_step_sequences",
            "Sequences decoded together per step (batch occupancy)",
            ["model"], buckets=ROW_BUCKETS, registry=metrics.registry,
        )  # fmt: skip
        self.cache_bytes = Gauge(
            "rlserve_lm_kv_cache_bytes", "Key/value cache held by the decoding sequences",
            ["model"], multiprocess_mode="livesum", registry=metrics.registry,
        )  # fmt: skip

    def accept_step(self, record: StepRecord) -> None:
        tally = self._models.get(record.model)
        if tally is None:
            tally = self._models[record.model] = _ModelTally.of(self, record.model)
        tally.new_tokens += record.new_tokens
        tally.prompt_tokens += record.prompt_tokens
        tally.cache_bytes = record.cache_bytes
        for sequences in record.step_sequences:
            tally.step_sequences.add(sequences)
        for seconds in record.first_token_s:
            tally.first_token.add(seconds)
        for seconds in record.inter_token_s:
            tally.inter_token.add(seconds)
        for version, seconds in record.answered:
            tally.answered[version] = tally.answered.get(version, 0) + 1
            tally.request_latency.add(seconds)

    def flush(self) -> None:
        for tally in self._models.values():
            tally.flush(self.metrics)


@dataclass
class _ModelTally:
    """What one language model's steps did since the last flush."""

    model: str
    generated: Any  # counter children
    prompted: Any
    cache_gauge: Any
    first_token: Tally
    inter_token: Tally
    step_sequences: Tally
    request_latency: Tally
    new_tokens: int = 0
    prompt_tokens: int = 0
    cache_bytes: int = 0
    answered: dict[int, int] = field(default_factory=dict)  # by version

    @classmethod
    def of(cls, families: GenerationMetrics, model: str) -> _ModelTally:
        metrics = families.metrics
        return cls(
            model,
            metrics.child(families.generated_tokens, model),
            metrics.child(families.prompt_tokens, model),
            metrics.child(families.cache_bytes, model),
            Tally.of(metrics.child(families.time_to_first_token, model)),
            Tally.of(metrics.child(families.inter_token, model)),
            Tally.of(metrics.child(families.step_sequences, model)),
            Tally.of(metrics.child(metrics.request_latency, model)),
        )

    def flush(self, metrics: Metrics) -> None:
        if self.new_tokens:
            self.generated.inc(self.new_tokens)
            self.new_tokens = 0
        if self.prompt_tokens:
            self.prompted.inc(self.prompt_tokens)
            self.prompt_tokens = 0
        self.cache_gauge.set(self.cache_bytes)
        for version, count in self.answered.items():
            metrics.child(metrics.requests, self.model, str(version), "200").inc(count)
        self.answered = {}
        for tally in (
            self.first_token,
            self.inter_token,
            self.step_sequences,
            self.request_latency,
        ):
            tally.flush()
