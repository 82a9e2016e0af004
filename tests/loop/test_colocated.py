"""The co-located runner's turn-taking, without a server (``loop/colocated.py``).

A fake server (hold, push, resume, model) that records every call, fake rollout workers
that publish records stamped with the fake server's active version into a real
``memory://`` buffer, the real sync controller, and a fake clock: the learning run itself
is ``tests/loop/test_learning_colocated.py``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel.errors import ConfigError
from loop.buffers import open_consumer, open_producer
from loop.colocated import FAILURE_WAIT_S, ColocatedRunner, HoldLost, StalenessViolation
from loop.controller import Batch, Fallback, SyncController
from loop.experience import Step

MODEL = "cartpole"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeServer:
    def __init__(self, clock: Clock, expire_hold: bool = False) -> None:
        self.clock, self.active, self.held = clock, 1, False
        self.calls: list[tuple[str, float, bool]] = []  # (call, time, held after it)
        self.expire_hold = expire_hold

    def hold(self, model: str, *, max_hold_s: float | None = None) -> dict[str, Any]:
        self.held = True
        self.calls.append(("hold", self.clock(), self.held))
        return {"model": model, "held": True, "max_hold_s": max_hold_s}

    def push(self, model: str, version: int, path: Path) -> dict[str, Any]:
        self.active = version  # a push while held activates (serve/control/updates.py)
        self.held = self.held and not self.expire_hold
        self.calls.append(("push", self.clock(), self.held))
        return {"result": "activated", "active_version": version}

    def model(self, model: str) -> dict[str, Any]:
        return {"active_version": self.active, "held": self.held}

    def resume(self, model: str) -> dict[str, Any]:
        self.held = False
        self.calls.append(("resume", self.clock(), self.held))
        return {"held": False}


class FakeWorker:
    """Publishes ``envs`` records per step, stamped with the server's active version; each
    step takes 1 ms of the fake clock and is refused while the model is held."""

    def __init__(self, name: str, server: FakeServer, buffer: str, envs: int) -> None:
        self.worker_id, self.server, self.envs = name, server, envs
        self.producer = open_producer(buffer)
        self.counters = type("Counters", (), {"published": 0})()
        self._steps = itertools.count()

    def step(self) -> bool:
        assert not self.server.held, "a worker stepped while the model was held"
        self.server.clock.now += 0.001
        n = next(self._steps)
        records = [
            Step(f"{self.worker_id}-{e}", n, np.zeros(4, np.float32), np.array(0), -0.69, 0.0,
                 1.0, False, False, self.server.active, 0.0)
            for e in range(self.envs)
        ]  # fmt: skip
        self.producer.publish(records)
        self.counters.published += len(records)
        return True


class Learner:
    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds
        self.batches: list[tuple[int, int, set[int]]] = []

    def update(self, batch: Batch, next_version: int) -> Path:
        self.clock.now += self.seconds
        self.batches.append(
            (next_version, len(batch.steps), {s.model_version for s in batch.steps})
        )
        return Path(f"/nonexistent/{next_version}/model.onnx")


def runner(
    name: str, server: FakeServer, clock: Clock, batch_size: int = 100, **kwargs: Any
) -> ColocatedRunner:
    buffer = f"memory://colocated-{name}"
    workers = [FakeWorker(f"w{i}", server, buffer, envs=8) for i in range(2)]
    controller = SyncController(
        open_consumer(buffer, "trainer", "trainer-0"), max_staleness=None,
        fallback=Fallback.DROP, version=1,
    )  # fmt: skip
    return ColocatedRunner(
        server, MODEL, workers, controller, version=1, batch_size=batch_size,  # type: ignore[arg-type]
        inference_interval=0.010, training_interval=0.050, clock=clock, sleep=clock.sleep,
        **kwargs,
    )  # fmt: skip


def test_phases_alternate_held_while_training_in_whole_quanta() -> None:
    clock = Clock()
    server = FakeServer(clock)
    run = runner("alternate", server, clock)
    learner = Learner(clock, seconds=0.12)
    cycles = [run.cycle(learner) for _ in range(3)]
    assert [c.version for c in cycles] == [2, 3, 4]
    assert server.active == 4
    assert not server.held
    # every batch: the whole inference turn (7 rounds of 16 records >= 100), one version
    assert learner.batches == [(2, 112, {1}), (3, 112, {2}), (4, 112, {3})]
    kinds = [p.kind for p in run.phases]
    assert kinds == ["inference", "training"] * 3
    for before, after in itertools.pairwise(run.phases):
        assert before.ended <= after.started
    for phase in run.phases:
        quanta = phase.seconds / phase.quantum_s
        assert quanta >= 1
        assert quanta == pytest.approx(round(quanta), abs=1e-6)  # a whole number of quanta
        assert phase.seconds >= phase.work_s
    # inference: 7 steps of 2 workers at 1 ms = 14 ms -> 2 quanta of 10 ms
    assert run.phases[0].seconds == pytest.approx(0.020)
    # training: 0.12 s of learning -> 3 quanta of 50 ms
    assert run.phases[1].seconds == pytest.approx(0.150)
    # the server: hold, push (still held), resume, per cycle; the push inside the hold
    assert [(c, held) for c, _, held in server.calls] == [
        ("hold", True), ("push", True), ("resume", False)
    ] * 3  # fmt: skip
    for phase in run.phases[1::2]:
        assert phase.held
        assert phase.held_at_resume
        assert phase.pushed["result"] == "activated"


def test_a_record_of_another_version_fails_loudly() -> None:
    clock = Clock()
    server = FakeServer(clock)
    run = runner("stale", server, clock)
    learner = Learner(clock, seconds=0.01)
    run.cycle(learner)
    stray = open_producer("memory://colocated-stale")  # e.g. a worker outside the runner
    stray.publish([Step("x-0", 0, np.zeros(4, np.float32), np.array(0), -0.69, 0.0, 1.0,
                        False, False, 1, 0.0)])  # fmt: skip
    with pytest.raises(StalenessViolation):
        run.cycle(learner)
    assert not server.held  # resumed even so


def test_a_hold_that_ran_out_during_the_update_fails_loudly() -> None:
    clock = Clock()
    server = FakeServer(clock, expire_hold=True)
    run = runner("expired", server, clock)
    with pytest.raises(HoldLost, match="max_hold_s"):
        run.cycle(Learner(clock, seconds=0.01))
    assert run.version == 1  # not counted as published


def test_settings_are_checked() -> None:
    clock = Clock()
    server = FakeServer(clock)
    with pytest.raises(ConfigError, match="max_hold_s"):
        runner("settings", server, clock, max_hold_s=0.01)
    with pytest.raises(ConfigError, match="batch_size"):
        runner("settings2", server, clock, batch_size=0)


class ServerGone(Exception):
    pass


def test_a_gone_server_explains_the_failure() -> None:
    """``check_server`` (a child server's ``check``) is asked before each cycle and when
    one fails: its error, not the symptom (a worker stopped, a refused push), is raised."""
    clock = Clock()
    server = FakeServer(clock)
    alive = [True]

    def check_server(*, wait_s: float = 0.0) -> None:
        if not alive[0]:
            raise ServerGone("the child server exited")

    run = runner("gone", server, clock, check_server=check_server)
    learner = Learner(clock, seconds=0.01)
    run.cycle(learner)
    alive[0] = False
    with pytest.raises(ServerGone):  # before the cycle: nothing is stepped
        run.cycle(learner)
    assert len(run.phases) == 2
    alive[0] = True
    run.workers[0].step = lambda: False  # type: ignore[method-assign]  # stopped on the exit
    with pytest.raises(RuntimeError, match="w0 was stopped"):
        run.cycle(learner)
    checks = iter([None, ServerGone("the child server exited")])

    waits: list[float] = []

    def exits_during_the_cycle(*, wait_s: float = 0.0) -> None:
        waits.append(wait_s)
        error = next(checks)
        if error is not None:
            raise error

    run.check_server = exits_during_the_cycle
    with pytest.raises(ServerGone) as gone:
        run.cycle(learner)
    assert isinstance(gone.value.__context__, RuntimeError)  # the symptom, kept as context
    assert waits == [0.0, FAILURE_WAIT_S]  # after the failure, time for a dying child to exit
    assert not server.held
