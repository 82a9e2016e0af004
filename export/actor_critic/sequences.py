"""Parity for a recurrent policy: whole sequences, each side fed the state it returned.

The parity observations are dealt into :data:`LANES` sequences, played side by side, one
batch of ``LANES`` rows per step. The first step of every sequence starts an episode; later
steps start a new one with probability :data:`RESTART`, so resets inside a batch are
checked too. onnxruntime is fed the ``next_state`` it returned at the step before, the
source the state the source returned: a difference that grows over an episode shows in
every later step's outputs, which :func:`parity.report` holds to the same tolerance as a
feed-forward policy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from export.actor_critic.observations import count
from export.actor_critic.source import Observations, PolicySource, SampledLogProb
from export.actor_critic.tensors import NEXT_STATE_OUTPUT, graph_feeds
from export.runner import Runner
from kernel.memory import Memory

LANES = 8
RESTART = 0.1


@dataclass(frozen=True)
class Replay:
    """Every step's rows, sequence by sequence (sequence 0's steps first)."""

    observations: Observations
    memory: Memory  # what onnxruntime was fed with each row
    ours: dict[str, np.ndarray]  # onnxruntime's outputs
    theirs: dict[str, np.ndarray]  # the source's outputs
    sampled: SampledLogProb | None  # the source's samples and log-probs, for a distribution
    sequences: int


def replay(source: PolicySource, run: Runner, observations: Observations, seed: int) -> Replay:
    assert source.state is not None, "replayed: recurrent policies"
    lanes = min(LANES, count(observations))
    steps = count(observations) // lanes
    starts = np.random.default_rng(seed + 2).random((steps, lanes)) < RESTART
    starts[0] = True
    ours_state = theirs_state = np.zeros((lanes, source.state.size), np.float32)
    fed, ours, theirs, sampled = [], [], [], []
    for step in range(steps):
        rows = np.arange(lanes) * steps + step
        batch = {key: array[rows] for key, array in observations.items()}
        memory = Memory(ours_state, starts[step])
        ours.append(run(graph_feeds(batch, None, memory)))
        source_memory = Memory(theirs_state, starts[step])
        theirs.append(source.reference.outputs(batch, None, source_memory))
        if source.sampler is not None:
            sampled.append(source.sampler.sampled_log_prob(batch, None, source_memory, seed + step))
        fed.append(memory)
        ours_state = ours[-1][NEXT_STATE_OUTPUT]
        theirs_state = theirs[-1][NEXT_STATE_OUTPUT].astype(np.float32)
    order = _sequence_major(steps, lanes)
    return Replay(
        # sequence i was dealt rows i * steps ...: already sequence by sequence
        observations={key: array[: steps * lanes] for key, array in observations.items()},
        memory=Memory(
            np.concatenate([m.state for m in fed])[order],
            np.concatenate([m.episode_start for m in fed])[order],
        ),
        ours=_joined(ours, order),
        theirs=_joined(theirs, order),
        sampled=None
        if not sampled
        else SampledLogProb(
            np.concatenate([s.actions for s in sampled])[order],
            np.concatenate([s.log_prob for s in sampled])[order],
        ),
        sequences=lanes,
    )


def _sequence_major(steps: int, lanes: int) -> np.ndarray:
    """Row order: from step-major (step 0 of every sequence, then step 1...) to sequence-major."""
    return np.arange(steps * lanes).reshape(steps, lanes).T.reshape(-1)


def _joined(outputs: list[dict[str, np.ndarray]], order: np.ndarray) -> dict[str, np.ndarray]:
    return {
        name: np.concatenate([np.asarray(step[name]) for step in outputs])[order]
        for name in outputs[0]
    }
