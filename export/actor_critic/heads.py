"""The deterministic action, computed in the graph from the distribution's first parameter.

Categorical: argmax of the logits. MultiDiscrete: argmax per dimension. MultiBinary:
``logits > 0`` (sigmoid rounded). Box: the Gaussian mean clipped to the space's bounds, in
the space's shape; for a squashed (tanh) actor, ``Rescale`` maps [-1, 1] to the bounds.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from kernel.spaces import Box, Discrete, Leaf, MultiDiscrete


class ArgMax(nn.Module):
    def forward(self, logits: Tensor) -> Tensor:
        return logits.argmax(dim=-1)


class ArgMaxPerDimension(nn.Module):
    def __init__(self, nvec: tuple[int, ...]) -> None:
        super().__init__()
        self.nvec = list(nvec)

    def forward(self, logits: Tensor) -> Tensor:
        parts = torch.split(logits, self.nvec, dim=-1)
        return torch.stack([part.argmax(dim=-1) for part in parts], dim=-1)


class Positive(nn.Module):
    def forward(self, logits: Tensor) -> Tensor:
        return (logits > 0).to(torch.int64)


class _BoxBounds(nn.Module):
    """A head that maps flat actions into a Box: its bounds as buffers, and its shape."""

    low: Tensor
    high: Tensor

    def __init__(self, space: Box) -> None:
        super().__init__()
        self.register_buffer("low", flat_float32(space.low_array))
        self.register_buffer("high", flat_float32(space.high_array))
        self.shape = space.shape


class ClippedMean(_BoxBounds):
    def forward(self, mean: Tensor) -> Tensor:
        clipped = torch.maximum(torch.minimum(mean, self.high), self.low)
        return clipped.reshape(mean.shape[0], *self.shape)


class Rescale(_BoxBounds):
    """An action in [-1, 1] to the Box's bounds: ``low + (a + 1) / 2 * (high - low)``
    (SB3's ``unscale_action``), in the space's shape."""

    def forward(self, scaled: Tensor) -> Tensor:
        action = self.low + 0.5 * (scaled + 1.0) * (self.high - self.low)
        return action.reshape(scaled.shape[0], *self.shape)


def deterministic_action(space: Leaf) -> nn.Module:
    if isinstance(space, Box):
        return ClippedMean(space)
    if isinstance(space, Discrete):
        return ArgMax()
    if isinstance(space, MultiDiscrete):
        return ArgMaxPerDimension(space.nvec)
    return Positive()


def flat_float32(bound: np.ndarray) -> Tensor:
    """A Box bound as a flat float32 tensor (a buffer of the graph)."""
    return torch.as_tensor(np.asarray(bound, dtype=np.float32).reshape(-1))
