"""Observation preprocessing baked into the graph: normalisation, then HWC to CHW.

Each observation input gets its own small pipeline, applied before the policy's network.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from export.actor_critic.normalization import LeafStats, NormStats


class Normalize(nn.Module):
    """clip((x - mean) / sqrt(var + eps)) in float64, as VecNormalize computes it; float32 out."""

    mean: Tensor
    std: Tensor

    def __init__(self, stats: LeafStats, clip: float | None, epsilon: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(stats.mean, dtype=torch.float64))
        self.register_buffer("std", torch.sqrt(torch.as_tensor(stats.var + epsilon)))
        self.clip = clip

    def forward(self, x: Tensor) -> Tensor:
        scaled = (x.to(torch.float64) - self.mean) / self.std
        if self.clip is not None:
            scaled = torch.clamp(scaled, -self.clip, self.clip)
        return scaled.to(torch.float32)


class ToChannelsFirst(nn.Module):
    """A batch of HWC images as CHW, the layout Stable-Baselines3's CNNs were trained on."""

    def forward(self, x: Tensor) -> Tensor:
        return x.permute(0, 3, 1, 2)


def leaf_pipeline(key: str | None, norm: NormStats | None, to_chw: bool) -> nn.Module:
    steps: list[nn.Module] = []
    if norm is not None and key in norm.leaves:
        steps.append(Normalize(norm.leaves[key], norm.clip, norm.epsilon))
    if to_chw:
        steps.append(ToChannelsFirst())
    return nn.Sequential(*steps)


def observation_pipelines(
    keys: list[str | None], norm: NormStats | None, chw_keys: set[str | None]
) -> nn.ModuleList:
    """One pipeline per observation input, in input order."""
    return nn.ModuleList(leaf_pipeline(key, norm, key in chw_keys) for key in keys)
