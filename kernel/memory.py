"""A recurrent policy's memory as its graph takes it (RecurrentPPO's LSTM states, or a torch
module's): beside each observation, the state row the contract's ``state`` layout
describes, and whether the observation starts an episode (the graph then zeroes the state).
The exporter feeds it to the source and the graph alike; the server builds it from a
request (``serve.policy.memory``) or from the sequences it holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Memory:
    """The state, and whether each observation starts an episode."""

    state: np.ndarray  # float32 [rows, size]
    episode_start: np.ndarray  # bool [rows]

    def rows(self, index: np.ndarray | slice) -> Memory:
        return Memory(self.state[index], self.episode_start[index])
