"""A rollout worker: steps a vector of gymnasium environments with actions the server samples,
and publishes every step as an experience record.

One iteration, for ``num_envs`` environments::

    answer = server.predict(observations)        # ONE request for all envs: actions,
                                                 # log_probs, values, model_version
    observations', rewards, ... = envs.step(answer.actions)
    buffer.publish([Step(...) for each env])     # ONE publish for all envs

Guarantees:

- **No lost or duplicated steps across server trouble.** A predict that fails with a
  transient error (connection refused or reset while the server restarts, 429 with
  Retry-After, 502, 503, 504, a timeout) is retried with backoff for up to ``retry_for_s``
  *before* the environments are stepped, so nothing is stepped twice or skipped. With a
  ``seed``, every try of an iteration sends the same sampling seed: a retry answered by the
  same version picks the same actions, and a run is reproducible.
- **Buffer back-pressure is waited out.** A publish that raises
  :class:`~loop.buffers.base.BufferFull` or :class:`~loop.buffers.base.BufferUnavailable`
  is retried with the *same* records for up to ``retry_for_s``; a record stored twice by a
  retry is harmless (consumers drop it by ``Step.key``, :class:`~loop.experience.Deduplicator`).
  A permanent refusal, :class:`~loop.buffers.base.RecordTooLarge` (a record over the
  buffer's size limit), is not retried: the worker stops at once with its message.
- **Episodes are contiguous.** Each environment's episode has its own ``episode_id``
  (``{worker_id}-{run_id}-{env}-{n}``; ``run_id`` is new for every worker object, so a
  restarted worker never repeats an id that a consumer would drop as a duplicate) and its
  steps are numbered 0, 1, 2, ... without gaps; the last step of a finished episode has
  ``terminated`` or ``truncated`` set. An episode still open when the worker stops simply
  has no ending step.
- **Each step keeps its own version**: ``model_version`` is the version that answered the
  request that chose its action (one version per answer: the server pins a request to the
  version active when it was admitted), even when an episode straddles a swap.
- **Prompt, counted stop**: SIGTERM or SIGINT (or :meth:`RolloutWorker.stop`) ends the loop
  within ``STOP_WITHIN_S`` whatever the server or the buffer is doing: the current
  iteration's records are published if the buffer takes them in time (a producer waits at
  most ``PUBLISH_TRY_S`` for room before the worker's own retries, which a stop ends),
  else counted in ``unaccepted`` and reported, never silently dropped; then the producer is
  flushed. A stop that arrives while the server is down ends the loop at once: nothing
  was stepped.

When retries run out, :class:`GaveUp` is raised (the envs were not stepped when the server
was the cause; the iteration's records were not stored when the buffer was).
"""

from __future__ import annotations

import dataclasses
import os
import random
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import gymnasium
import numpy as np

from client import EpisodeOutcome, PolicyClient, Prediction, RequestFailed
from kernel.errors import ConfigError, ServiceUnavailable, one_line
from loop.buffers import open_producer
from loop.buffers.base import BufferFull, BufferOptions, BufferUnavailable, Overflow, Producer
from loop.episode_reports import EpisodeReporter
from loop.experience import Step

Vectorization = Literal["auto", "sync", "async"]
VECTORIZATIONS: tuple[Vectorization, ...] = ("auto", "sync", "async")

OUTPUTS = ("actions", "log_probs", "values")
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})  # worth retrying: the server said so
FIRST_BACKOFF_S = 0.05
STOP_WITHIN_S = 2.0  # a stop ends the loop within this, whatever the buffer does
PUBLISH_TRY_S = 0.5  # one publish waits this long for room, at most (overflow: block)
MAX_BACKOFF_S = 1.0  # a restarted server is back within a second or two: look often


class GaveUp(ServiceUnavailable):
    """The server or the buffer kept failing for ``retry_for_s``: the worker stopped."""


# ---------------------------------------------------------------------- counters


@dataclass
class Counters:
    """What a worker has done so far (read them at any time; one worker writes them)."""

    env_steps: int = 0  # records made: one per env per iteration (NEXT_STEP resets excluded)
    episodes: int = 0  # finished episodes (terminated or truncated)
    requests: int = 0  # predict requests answered
    predict_retries: int = 0  # predict tries that failed and were tried again
    publish_retries: int = 0  # publishes refused by the buffer and tried again
    published: int = 0  # records the producer accepted
    unaccepted: int = 0  # records a stop left unpublished (the buffer pushed back)
    return_sum: float = 0.0  # over all finished episodes
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    versions: dict[int, int] = field(default_factory=dict)  # env steps per model version
    elapsed_s: float = 0.0  # time spent in run()
    predict_s: float = 0.0  # ... of which waiting for the server (retries included)
    env_s: float = 0.0  # ... stepping the environments
    publish_s: float = 0.0  # ... publishing (retries included)

    @property
    def retries(self) -> int:
        return self.predict_retries + self.publish_retries

    @property
    def mean_return(self) -> float | None:
        """The mean return of every finished episode; None before the first one."""
        return self.return_sum / self.episodes if self.episodes else None

    @property
    def recent_mean_return(self) -> float | None:
        """The mean return of the last 100 finished episodes; None before the first one."""
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The counters as JSON-ready values."""
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "requests": self.requests,
            "predict_retries": self.predict_retries,
            "publish_retries": self.publish_retries,
            "published": self.published,
            "unaccepted": self.unaccepted,
            "mean_return": self.mean_return,
            "recent_mean_return": self.recent_mean_return,
            "versions": {str(v): n for v, n in sorted(self.versions.items())},
            "elapsed_s": round(self.elapsed_s, 3),
            "steps_per_s": round(self.steps_per_s, 1),
            "seconds_in": {
                "predict": round(self.predict_s, 3),
                "env": round(self.env_s, 3),
                "publish": round(self.publish_s, 3),
            },
        }


# ---------------------------------------------------------------------- environments


def make_envs(
    env_id: str, num_envs: int, vectorization: Vectorization
) -> gymnasium.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` in one vector env that resets finished episodes
    itself: SAME_STEP for ``sync`` and ``async`` (gymnasium's wrappers around single envs);
    ``auto`` takes the environment's own vectorised implementation when it has one (CartPole
    does: about 10x faster at 64 envs) whatever its autoreset mode (NEXT_STEP is handled),
    and ``sync`` otherwise."""
    if num_envs < 1:
        raise ConfigError(f"num_envs must be at least 1, got {num_envs}")
    if vectorization not in VECTORIZATIONS:
        raise ConfigError(
            f"vectorization {vectorization!r}: use one of {', '.join(VECTORIZATIONS)}"
        )
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        raise ConfigError(f"env {env_id!r}: {one_line(e)}; give a registered gymnasium id") from e
    if vectorization == "auto" and spec.vector_entry_point is not None:
        envs = gymnasium.make_vec(spec, num_envs, vectorization_mode="vector_entry_point")
        if _autoreset(envs) in (
            gymnasium.vector.AutoresetMode.SAME_STEP,
            gymnasium.vector.AutoresetMode.NEXT_STEP,
        ):
            return envs
        envs.close()  # resets left to the caller: use the generic wrapper instead
    mode = "async" if vectorization == "async" else "sync"
    same_step = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}
    return gymnasium.make_vec(spec, num_envs, vectorization_mode=mode, vector_kwargs=same_step)


def _autoreset(envs: gymnasium.vector.VectorEnv) -> Any:
    return envs.metadata.get("autoreset_mode", gymnasium.vector.AutoresetMode.NEXT_STEP)


# ---------------------------------------------------------------------- retries


def transient(error: BaseException) -> bool:
    """Whether a failed predict may succeed if tried again: a connection problem (refused,
    reset, a timeout, a half-read answer) or a status the server sends while it is busy,
    starting or stopping."""
    if isinstance(error, RequestFailed):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, OSError)  # the client's connection errors are OSErrors


def stoppable(options: BufferOptions | None) -> BufferOptions:
    """The producer's options with one publish waiting at most PUBLISH_TRY_S for room, so a
    stop is seen between tries (the worker retries for retry_for_s itself); under
    ``overflow: drop`` the wait is the user's: it decides when records are dropped."""
    given = options or BufferOptions()
    if given.overflow is Overflow.DROP:
        return given
    return dataclasses.replace(given, publish_timeout_s=min(given.publish_timeout_s, PUBLISH_TRY_S))


class _Progress:
    """Calls ``report`` with the counters when ``every_s`` has passed since the last call."""

    def __init__(
        self,
        counters: Counters,
        report: Callable[[Counters], None] | None,
        every_s: float,
        started: float,
    ) -> None:
        self.counters, self.report, self.every_s, self.last = counters, report, every_s, started

    def due(self) -> None:
        now = time.monotonic()
        if self.report is not None and now - self.last >= self.every_s:
            self.report(self.counters)
            self.last = now


class Backoff:
    """Waits between the tries of one operation: doubling from ``FIRST_BACKOFF_S`` to
    ``MAX_BACKOFF_S`` with jitter, and at least as long as the server's Retry-After asks,
    until ``retry_for_s`` has passed since the first failure."""

    def __init__(self, retry_for_s: float) -> None:
        self.deadline = time.monotonic() + retry_for_s
        self.delay = FIRST_BACKOFF_S

    def wait(self, retry_after_s: float | None, stop: threading.Event | None = None) -> bool:
        """Sleep before the next try; False once the time is up (or ``stop`` was set)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        pause = max(retry_after_s or 0.0, self.delay * random.uniform(0.5, 1))
        self.delay = min(2 * self.delay, MAX_BACKOFF_S)
        if stop is None:
            time.sleep(min(pause, left))
            return True
        return not stop.wait(min(pause, left))


def publish_retried(
    producer: Producer,
    records: Sequence[Any],
    backoff_for_s: float,
    *,
    retried: Callable[[], None],
    lost: str,
    stop: threading.Event | None = None,
) -> bool:
    """Publish ``records``, the same ones again while the buffer pushes back (a trainer
    behind), for ``backoff_for_s`` since the first refusal: True once published; False when
    ``stop`` was set meanwhile (they stay unpublished); GaveUp, its message ending with
    ``lost``, when the time is up. ``retried`` is called for each refusal."""
    backoff: Backoff | None = None
    while True:
        try:
            producer.publish(records)
            return True
        except (BufferFull, BufferUnavailable) as error:
            retried()
            backoff = backoff or Backoff(backoff_for_s)
            if not backoff.wait(None, stop):
                if stop is not None and stop.is_set():
                    return False
                raise GaveUp(
                    f"the buffer refused {len(records)} records for {backoff_for_s:g}s "
                    f"(last: {error.message}); {lost}"
                ) from error


# ---------------------------------------------------------------------- the worker


class RolloutWorker:
    """Collects experience from ``num_envs`` copies of ``env_id`` with the policy served at
    ``server`` (``model``, or the server's default model), into the buffer at ``buffer``
    (a URL for :func:`loop.buffers.open_producer`).

    Use it as a context manager (or call :meth:`close`): it owns its environments, its HTTP
    connection and its producer. One thread runs it; :meth:`stop` may come from any thread.
    """

    def __init__(
        self,
        env_id: str,
        server: str,
        buffer: str,
        *,
        num_envs: int = 8,
        seed: int | None = None,
        model: str | None = None,
        worker_id: str | None = None,
        retry_for_s: float = 60.0,
        request_timeout_s: float = 10.0,
        vectorization: Vectorization = "auto",
        buffer_options: BufferOptions | None = None,
        lane: str | Path | None = None,
        report_episodes: bool = True,
        episode_token: str | None = None,
    ) -> None:
        if retry_for_s < 0:
            raise ConfigError(f"retry_for_s must be >= 0, got {retry_for_s}")
        self.env_id, self.server, self.model, self.num_envs = env_id, server, model, num_envs
        self.retry_for_s = retry_for_s
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.run_id = secrets.token_hex(4)  # new for every worker: episode ids never repeat
        # the worker's episodes are one client's: a model's canary serves them all on one
        # side (over HTTP; a lane is its own key)
        self.episode_key = f"{self.worker_id}-{self.run_id}"
        self.counters = Counters()
        self._stop = threading.Event()
        self._progress = _Progress(self.counters, None, 0.0, time.monotonic())

        with ExitStack() as opened:  # closed again if anything below fails
            self.producer: Producer = open_producer(buffer, stoppable(buffer_options))
            opened.callback(self.producer.close)
            self.envs = make_envs(env_id, num_envs, vectorization)
            opened.callback(self.envs.close)
            space = self.envs.single_observation_space
            if isinstance(space, gymnasium.spaces.Dict | gymnasium.spaces.Tuple):
                raise ConfigError(
                    f"env {env_id!r} has {type(space).__name__} observations; an experience "
                    "record holds one array: wrap the env to flatten them"
                )
            try:
                self.client = PolicyClient(server, timeout_s=request_timeout_s, lane=lane)
            except ValueError as e:
                raise ConfigError(f"server {server!r}: give it as http://HOST:PORT") from e
            opened.pop_all()
        self.reporter = EpisodeReporter(self.client, episode_token) if report_episodes else None
        self._next_step_reset = _autoreset(self.envs) == gymnasium.vector.AutoresetMode.NEXT_STEP

        # Per env: the episode it is in, the step within it, its return so far, and (NEXT_STEP
        # autoreset only) whether its next env.step() is the reset that starts a new episode.
        self._episode = np.zeros(num_envs, np.int64)
        self._step = np.zeros(num_envs, np.int64)
        self._return = np.zeros(num_envs, np.float64)
        self._resetting = np.zeros(num_envs, bool)
        self._version = np.zeros(num_envs, np.int64)  # the version of the episode's steps
        self._mixed = np.zeros(num_envs, bool)  # ... or several
        # With a seed, one sampling seed per request drawn from it (seeded requests cost the
        # server about 0.15 ms more each, so without one the server's randomness is used).
        self._seeds = None if seed is None else np.random.default_rng(seed)
        observations, _ = self.envs.reset(seed=seed)
        self._observations = np.array(observations, order="C")

    # -- the loop ---------------------------------------------------------------------

    def run(
        self,
        max_steps: int | None = None,
        until: Callable[[Counters], bool] | None = None,
        report: Callable[[Counters], None] | None = None,
        report_every_s: float = 5.0,
    ) -> Counters:
        """Iterate until ``max_steps`` env steps were made (whole iterations: up to
        ``num_envs - 1`` more), ``until(counters)`` is true, or a stop (:meth:`stop`,
        SIGTERM, SIGINT when run in the main thread); then flush the producer. ``report``
        is called every ``report_every_s`` seconds, also while the buffer pushes back. A
        stopped worker stays stopped."""
        started = time.monotonic()
        self._progress = _Progress(self.counters, report, report_every_s, started)
        elapsed_before = self.counters.elapsed_s
        try:
            with self._stop_on_signals():
                while not self._stop.is_set():
                    if max_steps is not None and self.counters.env_steps >= max_steps:
                        break
                    if until is not None and until(self.counters):
                        break
                    if not self.step():
                        break
                    self.counters.elapsed_s = elapsed_before + time.monotonic() - started
                    self._progress.due()
        finally:
            self.counters.elapsed_s = elapsed_before + time.monotonic() - started
        self.producer.flush(timeout_s=STOP_WITHIN_S / 2 if self._stop.is_set() else 10.0)
        return self.counters

    def step(self) -> bool:
        """One iteration: predict for all envs, step them, publish one record per env.
        False (and nothing stepped) when a stop came while the server was being retried."""
        seed = None if self._seeds is None else int(self._seeds.integers(2**31))
        answer = self._predict(self._observations, seed)
        if answer is None:
            return False
        served_at = time.time()
        observations = self._observations  # what the policy saw
        actions = np.asarray(answer.actions, dtype=self.envs.single_action_space.dtype)

        started = time.perf_counter()
        next_observations, rewards, terminated, truncated, _ = self.envs.step(actions)
        self._observations = np.array(next_observations, order="C")  # ours: envs may reuse theirs
        self.counters.env_s += time.perf_counter() - started

        records = self._records(
            observations, actions, answer, rewards, terminated, truncated, served_at
        )
        self._publish(records)
        return True

    def stop(self) -> None:
        """End :meth:`run` after the current iteration (at once while retrying a predict)."""
        self._stop.set()

    # -- one iteration's parts --------------------------------------------------------

    def _predict(self, observations: np.ndarray, seed: int | None) -> Prediction | None:
        """The server's answer for all envs, retried while the failure is transient (the
        same request each time); None if a stop came meanwhile."""
        started = time.perf_counter()
        backoff: Backoff | None = None
        try:
            while True:
                try:
                    answer = self.client.predict(
                        observations,
                        model=self.model,
                        deterministic=False,
                        seed=seed,
                        outputs=OUTPUTS,
                        episode_key=self.episode_key,
                    )
                    self.counters.requests += 1
                    return answer
                except (RequestFailed, OSError) as error:
                    if not transient(error):
                        raise self._refused(error) from error
                    self.counters.predict_retries += 1
                    backoff = backoff or Backoff(self.retry_for_s)
                    retry_after = error.retry_after_s if isinstance(error, RequestFailed) else None
                    if not backoff.wait(retry_after, self._stop):
                        if self._stop.is_set():
                            return None
                        raise GaveUp(
                            f"the server at {self.server} kept failing for "
                            f"{self.retry_for_s:g}s (last: {one_line(error)}); nothing was "
                            "stepped: check the server, or allow more with --retry-for-s"
                        ) from error
        finally:
            self.counters.predict_s += time.perf_counter() - started

    def _records(
        self,
        observations: np.ndarray,
        actions: np.ndarray,
        answer: Prediction,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        served_at: float,
    ) -> list[Step]:
        """One record per env (none for an env whose env.step() only reset it: NEXT_STEP
        autoreset), and the episode bookkeeping: numbering, returns, counters."""
        records = []
        for env in range(self.num_envs):
            if self._resetting[env]:
                self._resetting[env] = False
                continue
            ended = bool(terminated[env] or truncated[env])
            self._return[env] += rewards[env]
            self._served_by(env, answer.model_version)
            records.append(
                Step(
                    episode_id=f"{self.worker_id}-{self.run_id}-{env}-{self._episode[env]}",
                    step=int(self._step[env]),
                    observation=observations[env],
                    action=actions[env],
                    log_prob=float(answer.log_probs[env]),
                    value=float(answer.values[env]),
                    reward=float(rewards[env]),
                    terminated=bool(terminated[env]),
                    truncated=bool(truncated[env]),
                    model_version=answer.model_version,
                    served_at=served_at,
                    episode_return=float(self._return[env]) if ended else None,
                )
            )
            self._step[env] += 1
            if ended:
                self._end_episode(env, answer.model, bool(terminated[env]))
        versions = self.counters.versions
        versions[answer.model_version] = versions.get(answer.model_version, 0) + len(records)
        self.counters.env_steps += len(records)
        return records

    def _served_by(self, env: int, version: int) -> None:
        """Note the version that served an episode's step (its first sets it)."""
        if self._step[env] == 0:
            self._version[env], self._mixed[env] = version, False
        elif self._version[env] != version:
            self._mixed[env] = True

    def _end_episode(self, env: int, model: str, terminated: bool) -> None:
        if self.reporter is not None:
            outcome = None
            if not self._mixed[env]:
                outcome = EpisodeOutcome(
                    int(self._version[env]), float(self._return[env]),
                    int(self._step[env]), terminated, not terminated,
                )  # fmt: skip
            self.reporter.finished(model, outcome)
        self.counters.episodes += 1
        self.counters.return_sum += float(self._return[env])
        self.counters.recent_returns.append(float(self._return[env]))
        self._episode[env] += 1
        self._step[env] = 0
        self._return[env] = 0.0
        self._resetting[env] = self._next_step_reset

    def _publish(self, records: Sequence[Step]) -> None:
        """Publish ``records``, the same ones again while the buffer pushes back, for
        ``retry_for_s``; a stop ends the retries, and what was not accepted is counted."""
        started = time.perf_counter()
        try:
            accepted = publish_retried(
                self.producer, records, self.retry_for_s, retried=self._publish_refused,
                lost="they are lost and their episodes end without a last step: make the "
                "trainer keep up, or allow more with --retry-for-s", stop=self._stop,
            )  # fmt: skip
            if accepted:
                self.counters.published += len(records)
            else:
                self.counters.unaccepted += len(records)
        finally:
            self.counters.publish_s += time.perf_counter() - started

    def _publish_refused(self) -> None:
        self.counters.publish_retries += 1
        self._progress.due()  # a trainer gone or behind: say so while waiting

    def _refused(self, error: BaseException) -> ConfigError:
        where = f"model {self.model!r}" if self.model else "the server's default model"
        return ConfigError(
            f"{where} at {self.server} refused the observations of {self.env_id!r}: "
            f"{one_line(error)}; check that --server and --model name the policy trained "
            "for this environment"
        )

    # -- signals and cleanup ----------------------------------------------------------

    @contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """In the main thread: the first SIGTERM/SIGINT asks for a stop; the handlers in
        place before come back at once, so a second signal acts as it did before."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.getsignal(sig) or signal.SIG_DFL for sig in (signal.SIGTERM, signal.SIGINT)
        }

        def handle(signum: int, frame: FrameType | None) -> None:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        for sig in previous:
            signal.signal(sig, handle)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def close(self) -> None:
        """Send the episode reports still waiting; close the environments, the connection
        and the producer."""
        if self.reporter is not None:
            self.reporter.flush()
        self.envs.close()
        self.client.close()
        self.producer.close()

    def __enter__(self) -> RolloutWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
