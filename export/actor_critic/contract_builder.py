"""Filling in the policy contract for an exported graph, golden vectors included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, cast

import numpy as np

from export.actor_critic.observations import request_form
from export.actor_critic.source import Observations, PolicySource
from export.actor_critic.tensors import graph_feeds, input_specs
from export.runner import Runner
from kernel import __version__
from kernel.contract import SCHEMA, Exporter, GoldenVector, PolicyContract
from kernel.memory import Memory
from kernel.spaces import parse_observations

GOLDEN_COUNT = 4
GOLDEN_ATOL = 1e-4


def golden_vectors(
    source: PolicySource,
    run: Runner,
    observations: Observations,
    action_masks: np.ndarray | None,
    memory: Memory | None = None,
) -> list[GoldenVector]:
    """The first observations, one per vector (with its mask, for a masked policy; with the
    state it was fed, for a recurrent one), with every output onnxruntime gives for them.

    Each is run exactly as a loader will re-run it: parsed from its request JSON form.
    """
    return [
        _golden(
            source,
            run,
            request_form(observations, row),
            None if action_masks is None else action_masks[row : row + 1],
            None if memory is None else memory.rows(slice(row, row + 1)),
        )
        for row in range(GOLDEN_COUNT)
    ]


def _golden(
    source: PolicySource,
    run: Runner,
    request: object,
    masks: np.ndarray | None,
    memory: Memory | None,
) -> GoldenVector:
    batch = parse_observations(source.observation_space, request)
    outputs = run(graph_feeds(batch.arrays, masks, memory))
    return GoldenVector(
        observations=request,
        outputs={name: value.tolist() for name, value in outputs.items()},
        action_masks=None if masks is None else masks.tolist(),
        state=None if memory is None else memory.state.tolist(),
        episode_start=None if memory is None else memory.episode_start.tolist(),
    )


def build_contract(
    source: PolicySource, version: int, opset: int, golden: list[GoldenVector]
) -> PolicyContract:
    return PolicyContract(
        schema=cast(Literal["rlserve.policy/v1"], SCHEMA),  # the field's only value
        algorithm=source.algorithm,
        source=source.provenance,
        observation_space=source.observation_space,
        action_space=source.action_space,
        inputs=input_specs(
            source.observation_space,
            source.action_space,
            action_masks=source.action_masks,
            state=source.state,
        ),
        outputs=source.output_specs(),
        distribution=source.distribution,
        preprocessing=source.preprocessing,
        state=source.state,
        policy_version=version,
        exporter=Exporter(version=__version__),
        opset=opset,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        golden=golden,
        golden_atol=GOLDEN_ATOL,
    )
