"""A prompt worker: GRPO's rollout worker for a language-model policy.

Each :meth:`PromptWorker.step` takes the next ``groups`` prompts of the dataset and asks
the server for a group of ``group_size`` completions of each, in one generate call per
prompt (``n``: the prompt is prefilled once for the group), all of them in flight at once
so that the server batches them. A call asks for:

- ``temperature`` 1 with no ``top_k`` or ``top_p`` cut, so that the completions are drawn
  from the policy itself and the log-probs the server answers (the model's own, at
  temperature 1) are the behaviour policy's;
- ``echo``, for the prompt's token ids as the model saw them (its chat template applied);
- a ``seed`` drawn from the worker's seed, when it has one: a run can be replayed.

Each completion is scored by the reward function with the prompt's row and published as a
:class:`~loop.experience.Completion` (token ids, behaviour log-probs, reward, the group,
the version that sampled it). The whole group is published at once, in index order.

Failures as in ``loop.collect``: a transient failure of the server (connection, 429, 502,
503, 504) is retried with backoff for up to ``retry_for_s`` (the same call, so nothing is
sampled twice into the buffer); a refusal (4xx) stops the worker with ConfigError naming
it; a buffer that pushes back is tried again with the same records.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from kernel.errors import ConfigError
from loop.buffers import open_producer
from loop.buffers.base import BufferOptions, Producer
from loop.collect import TRANSIENT_STATUSES, Backoff, GaveUp, publish_retried, stoppable
from loop.experience import Completion
from loop.grpo.prompts import PromptRow, Prompts
from loop.grpo.rewards import Reward


@dataclass
class PromptCounters:
    """What a prompt worker has done (one worker writes them; read at any time)."""

    groups: int = 0  # groups sampled and published
    published: int = 0  # completions the producer accepted
    unaccepted: int = 0  # completions a stop left unpublished (the buffer pushed back)
    tokens: int = 0  # completion tokens sampled
    retries: int = 0  # generate calls or publishes that failed and were tried again
    reward_sum: float = 0.0
    recent_rewards: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    versions: dict[int, int] = field(default_factory=dict)  # completions per model version
    generate_s: float = 0.0  # waiting for the server (retries included)
    publish_s: float = 0.0  # publishing, waiting for the buffer's room included

    @property
    def mean_reward(self) -> float | None:
        """The mean reward of the last 256 completions; None before the first."""
        recent = self.recent_rewards
        return sum(recent) / len(recent) if recent else None


@dataclass(frozen=True, slots=True)
class Sampling:
    """How each group is sampled."""

    group_size: int = 8  # completions per prompt (GRPO's G; the server's n)
    max_new_tokens: int = 16
    groups: int = 4  # prompts per step, in flight together

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError(
                f"group_size {self.group_size}: a group needs at least 2 completions (its "
                "advantages are relative to each other)"
            )
        if self.max_new_tokens < 1 or self.groups < 1:
            raise ConfigError("max_new_tokens and groups must be at least 1")


class PromptWorker:
    """Samples groups from ``model`` at ``server`` for the prompts of ``prompts`` and
    publishes them to ``buffer``. Use it as a context manager (or call :meth:`close`)."""

    def __init__(
        self,
        server: str,
        model: str,
        buffer: str,
        prompts: Prompts,
        reward: Reward,
        *,
        sampling: Sampling | None = None,
        seed: int | None = None,
        worker_id: str = "prompts",
        retry_for_s: float = 60.0,
        request_timeout_s: float = 60.0,
        buffer_options: BufferOptions | None = None,
    ) -> None:
        self.server, self.model, self.prompts, self.reward = server, model, prompts, reward
        self.sampling = sampling or Sampling()
        self.worker_id, self.run_id = worker_id, secrets.token_hex(4)
        self.retry_for_s = retry_for_s
        self.counters = PromptCounters()
        self._seeds = None if seed is None else np.random.default_rng(seed)
        self._stop = threading.Event()
        self.producer: Producer = open_producer(buffer, stoppable(buffer_options))
        self._http = httpx.Client(base_url=server, timeout=request_timeout_s)
        self._pool = ThreadPoolExecutor(self.sampling.groups, thread_name_prefix=worker_id)

    def __enter__(self) -> PromptWorker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()
        self.producer.close()

    def stop(self) -> None:
        """End the current step's retries (from any thread)."""
        self._stop.set()

    def step(self) -> bool:
        """Sample and publish ``sampling.groups`` groups; False once stopped."""
        if self._stop.is_set():
            return False
        rows = [self.prompts.next() for _ in range(self.sampling.groups)]
        seeds = [None if self._seeds is None else int(self._seeds.integers(2**31)) for _ in rows]
        started = time.perf_counter()
        answers = list(self._pool.map(self._generate, rows, seeds))
        self.counters.generate_s += time.perf_counter() - started
        if any(answer is None for answer in answers):
            return False
        records = []
        for row, answer in zip(rows, answers, strict=True):
            assert answer is not None
            records += self._group(row, answer)
        self._publish(records)
        return not self._stop.is_set()

    def _generate(self, row: PromptRow, seed: int | None) -> dict[str, Any] | None:
        """The server's group for ``row``, retried while the failure is transient; None if a
        stop came meanwhile."""
        body = {
            **row.request(),
            "n": self.sampling.group_size,
            "max_new_tokens": self.sampling.max_new_tokens,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "echo": True,
        }
        if seed is not None:
            body["seed"] = seed
        backoff: Backoff | None = None
        while True:
            failure: str
            retry_after: float | None = None
            try:
                answer = self._http.post(f"/v1/models/{self.model}/generate", json=body)
            except httpx.TransportError as error:
                failure = f"{type(error).__name__}: {error}"
            else:
                if answer.status_code == 200:
                    result: dict[str, Any] = answer.json()
                    return result
                if answer.status_code not in TRANSIENT_STATUSES:
                    raise ConfigError(
                        f"model {self.model!r} at {self.server} refused the prompt of line "
                        f"{row.line}: {answer.status_code} {answer.text[:300]}"
                    )
                failure = f"{answer.status_code} {answer.text[:200]}"
                header = answer.headers.get("retry-after")
                retry_after = float(header) if header and header.isdigit() else None
            self.counters.retries += 1
            backoff = backoff or Backoff(self.retry_for_s)
            if not backoff.wait(retry_after, self._stop):
                if self._stop.is_set():
                    return None
                raise GaveUp(
                    f"the server at {self.server} kept failing for {self.retry_for_s:g}s "
                    f"(last: {failure}); nothing was published for this step"
                )

    def _group(self, row: PromptRow, answer: dict[str, Any]) -> list[Completion]:
        """One record per completion of the group, scored, and the counters."""
        group_id = f"{self.worker_id}-{self.run_id}-{self.counters.groups}"
        prompt_ids = np.asarray(answer["prompt"]["token_ids"], np.int32)
        version, served_at = int(answer["model_version"]), time.time()
        choices = answer["choices"]
        records = []
        for choice in choices:
            reward = float(self.reward(choice["text"], row.row))
            records.append(
                Completion(
                    group_id=group_id,
                    index=int(choice["index"]),
                    group_size=len(choices),
                    prompt_ids=prompt_ids,
                    completion_ids=np.asarray(choice["token_ids"], np.int32),
                    log_probs=np.asarray(choice["log_probs"], np.float64),
                    reward=reward,
                    finish_reason=str(choice["finish_reason"]),
                    model_version=version,
                    served_at=served_at,
                )
            )
            self.counters.reward_sum += reward
            self.counters.recent_rewards.append(reward)
            self.counters.tokens += len(choice["token_ids"])
        self.counters.groups += 1
        versions = self.counters.versions
        versions[version] = versions.get(version, 0) + len(records)
        return records

    def _publish(self, records: Sequence[Completion]) -> None:
        """Publish ``records``, the same ones again while the buffer pushes back (a trainer
        behind: the workers wait for it); a stop meanwhile leaves them unpublished."""
        started = time.perf_counter()
        try:
            published = publish_retried(
                self.producer, records, self.retry_for_s, retried=self._publish_refused,
                lost="these completions are lost", stop=self._stop,
            )  # fmt: skip
            if published:
                self.counters.published += len(records)
            else:
                self.counters.unaccepted += len(records)
        finally:
            self.counters.publish_s += time.perf_counter() - started

    def _publish_refused(self) -> None:
        self.counters.retries += 1
