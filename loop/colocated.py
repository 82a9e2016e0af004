"""The co-located runner: server, rollout and trainer take turns on one node's device.

``cluster_mode: co-located`` (issue #11, item 5). One node, one process tree: one trainer
process, which also runs the rollout workers in-process (:class:`~loop.collect.RolloutWorker`
on a ``memory://`` buffer, stepped by the runner's own thread: no worker threads, nothing
crosses the network but the predicts), and the policy server (``rlserve serve``), its child
(:class:`~loop.child_server.ChildServer`) or started separately. The runner owns the
turn-taking; each cycle is two phases:

1. **INFERENCE** (version ``V`` active, the model serving): the workers step, round-robin,
   whole iterations (one request for all of a worker's envs), until they have published at
   least ``batch_size`` records. Then they stop: no record of ``V`` is made that would be
   trained on after ``V + 1`` exists. The batch is everything the turn published: at least
   ``batch_size`` records, fewer than one more round of the workers' envs above it (an env
   that is resetting publishes no record that iteration, so a round's count varies).
2. **TRAINING**: the runner holds the served model (``PolicyClient.hold(model,
   max_hold_s=...)``: no batch forms, requests queue; see docs/updates.md), takes the batch
   from the buffer through the :class:`~loop.controller.SyncController`, asserts that every
   record in it has ``model_version == V`` (staleness 0; :class:`StalenessViolation`
   otherwise), and hands it to the learner, which updates and exports version ``V + 1``.
   The runner pushes ``V + 1`` **while the model is held**: a push is checked, loaded,
   warmed and activated whatever the hold (``serve/control/updates.py`` never looks at
   the hold; the hold only stops batches from forming), so ``V + 1`` is active before any
   request can run again. The runner then reads the model's state back and requires it
   still held with ``V + 1`` active (:class:`HoldLost` if ``max_hold_s`` ran out during
   the update, or another writer moved the version), commits the batch, and **resumes**.

So no request is answered by ``V`` after its batch was closed, and no inference competes
with the update on the device: staleness is 0 by construction, and checked.

``task_schedule`` (``inference_interval``, ``training_interval``) are the phases' time
quanta. A turn is a whole number of its quanta, at least one: the work of a phase (one
batch of rollout, one update) is never cut short, and the switch to the other phase
happens at the first quantum boundary after it is done (the runner waits out the rest of
the quantum; so an inference turn lasts at least ``inference_interval`` and a training
turn at least ``training_interval``, and phases switch at most once per quantum). On a GPU
these are the time slices in which the shared device alternates between serving and
training (``gpu_allocation`` gives both roles the same devices); on CPU they only bound how
often the phases switch, and with the reference 10 ms / 50 ms they are much shorter than a
batch of rollout (~0.3 s) or an update with its export (~1 s), so they cost at most one
quantum of idling per turn. Every turn is recorded (:class:`Phase`) with what the server
answered, so a run can show the alternation, the turn lengths and the holds.

The workers are anything that steps and publishes (:class:`Worker`): rollout workers of
environments (``loop.collect.RolloutWorker``, PPO) or prompt workers sampling groups of
completions (``loop.grpo.worker.PromptWorker``, GRPO). The learner is anything with
``update(batch, next_version) -> Path``: learn from the batch (all of version
``next_version - 1``), export the new weights and return the file to push
(``examples/ppo_colocated.py`` wraps the reference PPO trainer's update and export,
``examples/grpo_colocated.py`` the GRPO trainer's).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from client import PolicyClient
from kernel.errors import ConfigError
from loop.buffers.base import Producer
from loop.controller import Batch, SyncController

PhaseKind = Literal["inference", "training"]


class StalenessViolation(AssertionError):
    """A record in a co-located training batch was not made by the trainer's version."""


class HoldLost(RuntimeError):
    """The model was not held (or not at the pushed version) at the end of a training turn."""


class Published(Protocol):
    published: int  # records the worker's producer accepted


class Worker(Protocol):
    """What the runner steps: one unit of rollout per call, published to ``producer``."""

    worker_id: str
    producer: Producer

    @property
    def counters(self) -> Published: ...

    def step(self) -> bool:
        """Collect and publish once; False once the worker was stopped."""
        ...


class Learner(Protocol):
    def update(self, batch: Batch[Any], next_version: int) -> Path:
        """Learn from ``batch``; export ``next_version`` and return its model file."""
        ...


@dataclass(frozen=True)
class Phase:
    """One turn. Times are ``time.monotonic()`` seconds; ``work_s`` is the phase's work
    (collecting, or learning and publishing) before waiting out its quantum."""

    kind: PhaseKind
    version: int  # the version serving (inference) or trained on (training)
    started: float
    ended: float
    work_s: float
    quantum_s: float
    records: int = 0  # collected (inference) or trained from the buffer (training)
    held: bool | None = None  # training: the hold's answer said held
    held_at_resume: bool | None = None  # training: the model was still held just before resume
    pushed: dict[str, Any] = field(default_factory=dict)  # training: the push's answer
    # training: the weight update's parts (the learner's update, learning and exporting;
    # the push's round trip, the server's load and swap in it; the resume's round trip)
    update: UpdateTimes | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "started": round(self.started, 6),
            "ended": round(self.ended, 6),
            "seconds": round(self.seconds, 6),
            "work_s": round(self.work_s, 6),
            "quantum_s": self.quantum_s,
            "records": self.records,
            "held": self.held,
            "held_at_resume": self.held_at_resume,
            "push_result": self.pushed.get("result"),
            "push_active_version": self.pushed.get("active_version"),
            **({} if self.update is None else self.update.to_json()),
        }


@dataclass(frozen=True)
class UpdateTimes:
    """Where a training turn's weight update went, in seconds."""

    learner_s: float  # Learner.update: learning from the batch and exporting the version
    push_s: float  # the push's round trip: the server checks, loads and activates it
    load_s: float  # ... of which loading (the server's own count)
    swap_s: float  # ... of which activating
    resume_s: float  # the resume's round trip: the new version serves from its end

    def to_json(self) -> dict[str, float]:
        return {f"update_{k}": round(v, 4) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Cycle:
    """One inference turn, then the training turn on its batch."""

    inference: Phase
    training: Phase
    batch: Batch[Any]
    version: int  # after the cycle: the version pushed


class ServerCheck(Protocol):
    """Raises when the policy server can no longer answer (see ColocatedRunner)."""

    def __call__(self, *, wait_s: float = 0.0) -> None: ...


def no_check(*, wait_s: float = 0.0) -> None:
    """A server this process does not run: its failures show as the requests' errors."""


# After a failed cycle, how long a server that may be dying gets to be seen as exited.
FAILURE_WAIT_S = 2.0


class ColocatedRunner:
    """Alternates the phases described in the module docstring.

    ``client`` must carry the server's admin token (hold, push, resume); ``version`` is the
    version the server serves now and the controller's version. ``workers`` publish into
    the buffer ``controller`` consumes; the runner steps them itself. ``check_server``
    raises when the server can no longer answer (``loop.child_server.ChildServer.check``:
    the child exited); it is called before each cycle, and when one fails with
    ``wait_s=FAILURE_WAIT_S`` (the failure may be the server's death, not yet seen as an
    exit: that wait ends as soon as it is, and delays only a run that is failing anyway).
    ``repository`` is
    the server's model repository when this process shares its filesystem: a learner's file
    inside it is pushed by its path, with the files beside it."""

    def __init__(
        self,
        client: PolicyClient,
        model: str,
        workers: Sequence[Worker],
        controller: SyncController[Any],
        *,
        version: int,
        batch_size: int,
        inference_interval: float,
        training_interval: float,
        max_hold_s: float = 60.0,
        repository: Path | None = None,
        check_server: ServerCheck = no_check,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not workers:
            raise ConfigError("the co-located runner needs at least one rollout worker")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if inference_interval <= 0 or training_interval <= 0:
            raise ConfigError(
                f"task_schedule intervals must be > 0 (got {inference_interval:g} s, "
                f"{training_interval:g} s)"
            )
        if max_hold_s <= training_interval:
            raise ConfigError(
                f"max_hold_s {max_hold_s:g} must exceed training_interval {training_interval:g}"
            )
        self.client, self.model, self.workers = client, model, list(workers)
        self.controller = controller
        self.version = version
        self.batch_size = batch_size
        self.inference_interval, self.training_interval = inference_interval, training_interval
        self.max_hold_s = max_hold_s
        self.repository = None if repository is None else repository.resolve()
        self.check_server = check_server
        self._clock, self._sleep = clock, sleep
        self.phases: list[Phase] = []

    # ------------------------------------------------------------------ one cycle

    def cycle(self, learner: Learner) -> Cycle:
        """One inference turn (collect one batch with the current version), then one
        training turn (held: learn, push the next version, resume). A failure is reported
        as ``check_server``'s error when the server is gone: that explains it."""
        self.check_server()
        try:
            inference = self._inference()
            training, batch = self._training(learner, inference.records)
        except Exception:
            self.check_server(wait_s=FAILURE_WAIT_S)
            raise
        self.phases += [inference, training]
        return Cycle(inference, training, batch, self.version)

    def _inference(self) -> Phase:
        started = self._clock()
        before = sum(w.counters.published for w in self.workers)
        collected = 0
        while collected < self.batch_size:
            for worker in self.workers:
                if not worker.step():
                    raise RuntimeError(f"rollout worker {worker.worker_id} was stopped")
            collected = sum(w.counters.published for w in self.workers) - before
        for worker in self.workers:
            worker.producer.flush()
        work_s = self._clock() - started
        ended = self._end_of_quantum(started, self.inference_interval)
        return Phase("inference", self.version, started, ended, work_s,
                     self.inference_interval, records=collected)  # fmt: skip

    def _training(self, learner: Learner, collected: int) -> tuple[Phase, Batch[Any]]:
        started = self._clock()
        held = self.client.hold(self.model, max_hold_s=self.max_hold_s)
        if held.get("held") is not True:
            raise HoldLost(f"model {self.model!r}: hold answered {held}")
        try:
            batch = self.controller.next_batch(collected, timeout_s=1.0)
            self._check_staleness(batch, collected)
            next_version = self.version + 1
            learning = self._clock()
            path = learner.update(batch, next_version)
            pushing = self._clock()
            pushed = self._push(next_version, path)
            pushed_at = self._clock()
            state = self.client.model(self.model)
            if not state.get("held") or state.get("active_version") != next_version:
                raise HoldLost(
                    f"model {self.model!r} after pushing version {next_version}: held "
                    f"{state.get('held')}, active version {state.get('active_version')}; the "
                    f"hold must last the whole update (raise max_hold_s, {self.max_hold_s:g} "
                    "s) and no other writer may push"
                )
            self.version = next_version
            self.controller.set_version(next_version)
            self.controller.commit(batch)
            work_s = self._clock() - started
            self._end_of_quantum(started, self.training_interval)
        finally:
            resuming = self._clock()
            self.client.resume(self.model)  # also after a failure: never leave it held
        ended = self._clock()
        update = UpdateTimes(
            pushing - learning, pushed_at - pushing, float(pushed.get("load_s") or 0.0),
            float(pushed.get("swap_s") or 0.0), ended - resuming,
        )  # fmt: skip
        phase = Phase("training", next_version - 1, started, ended, work_s, self.training_interval,
                      records=len(batch.steps), held=True, held_at_resume=True,
                      pushed=pushed, update=update)  # fmt: skip
        return phase, batch

    def _push(self, version: int, path: Path) -> dict[str, Any]:
        """A file inside the server's repository (``repository``) is pushed by its path there
        (a language model's version must be: its tokenizer comes with it); any other by its
        bytes."""
        inside = self.repository is not None and path.resolve().is_relative_to(self.repository)
        if not inside:
            return self.client.push(self.model, version, path)
        assert self.repository is not None
        relative = str(path.resolve().relative_to(self.repository))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return self.client.push_from_repository(self.model, version, relative, digest)

    def _check_staleness(self, batch: Batch[Any], collected: int) -> None:
        if len(batch.steps) != collected or self.controller.next_batch(1, 0.0).steps:
            raise StalenessViolation(
                f"the buffer did not hold exactly the {collected} records of the inference "
                f"turn (got {len(batch.steps)}, or more): another producer writes into it, or "
                "records were lost"
            )
        wrong = sorted({s.model_version for s in batch.steps} - {self.version})
        if wrong or batch.version != self.version:
            raise StalenessViolation(
                f"co-located batch for version {self.version} holds records of versions "
                f"{wrong} (controller at {batch.version}): staleness must be 0"
            )

    def _end_of_quantum(self, started: float, quantum: float) -> float:
        """Wait until a whole number (at least one) of quanta has passed since ``started``."""
        elapsed = self._clock() - started
        turns = max(1, math.ceil(elapsed / quantum - 1e-9))
        remaining = started + turns * quantum - self._clock()
        if remaining > 0:
            self._sleep(remaining)
        return self._clock()
