"""Calling a torch module's method once to learn its distribution and check it fits.

The method must return ``(distribution, value)``: a supported distribution whose width
matches the action space, and one value per observation (``[B]`` or ``[B, 1]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.actor_critic.action_spaces import distribution_for
from export.actor_critic.normalization import NormStats
from export.actor_critic.tensors import parameter_width
from export.errors import ExportError
from export.modules import distributions
from kernel.distributions import DistributionKind
from kernel.spaces import Leaf, sample

_PROBE_BATCH = 2


def check_method(
    module: nn.Module,
    method: str,
    observation_space: Leaf,
    action_space: Leaf,
    norm: NormStats | None,
) -> None:
    distribution, value = _call(module, method, observation_space, norm)
    kind = distributions.kind_of(distribution)
    _check_distribution(kind, distribution, action_space, method)
    if not isinstance(value, Tensor) or value.numel() != _PROBE_BATCH:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ExportError(
            f"--method {method}: the value must be [B] or [B, 1]; got {shape} for B={_PROBE_BATCH}"
        )


def sample_batch(space: Leaf, norm: NormStats | None) -> np.ndarray:
    """A few observations as the method is called on them (normalised when statistics are
    given), float32."""
    x = sample(space, np.random.default_rng(0), _PROBE_BATCH)
    if norm is not None:
        x = norm.apply(None, x)
    return np.asarray(x, dtype=np.float32)


def _call(module: nn.Module, method: str, space: Leaf, norm: NormStats | None) -> tuple[Any, Any]:
    x = sample_batch(space, norm)
    with torch.no_grad(), distributions.no_argument_validation():
        try:
            returned = getattr(module, method)(torch.as_tensor(x, dtype=torch.float32))
        except Exception as exc:  # the user's code may raise anything
            raise ExportError(
                f"--method {method}: calling it on a batch of {_PROBE_BATCH} observations "
                f"failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None
    if not isinstance(returned, tuple | list) or len(returned) != 2:
        raise ExportError(
            f"--method {method}: must return (distribution, value); got {type(returned).__name__}"
        )
    return returned[0], returned[1]


def _check_distribution(
    kind: DistributionKind, distribution: Any, action_space: Leaf, method: str
) -> None:
    expected = distribution_for(action_space)
    width = int(distributions.parameters(distribution, kind)[0].shape[-1])
    nvec = (
        [int(part.logits.shape[-1]) for part in distribution]
        if kind is DistributionKind.MULTI_CATEGORICAL
        else None
    )
    if kind is not expected.kind or width != parameter_width(action_space) or nvec != expected.nvec:
        got = f"{kind.value} of width {width}" + (f" (nvec {nvec})" if nvec else "")
        wanted = f"{expected.kind.value} of width {parameter_width(action_space)}" + (
            f" (nvec {expected.nvec})" if expected.nvec else ""
        )
        raise ExportError(
            f"--method {method}: returns a {got} distribution, but the action space "
            f"{action_space.model_dump_json()} needs a {wanted} one"
        )
