"""The raw observation layout of a Stable-Baselines3 policy, and which leaves are images.

SB3 trains CNNs on CHW images: for an HWC image environment it wraps the env in
VecTransposeImage, and the checkpoint stores the transposed (CHW) space. With
``image_layout="hwc"`` (the default) the exported graph takes the environment's HWC images
and transposes them itself; ``"chw"`` is for environments that already emit CHW.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from export.errors import ExportError
from kernel.contract import ImageScaling
from kernel.errors import InvalidInput
from kernel.spaces import Box, Dict, Leaf, from_gymnasium


class ImageLayout(StrEnum):
    HWC = "hwc"
    CHW = "chw"


@dataclass(frozen=True)
class ObservationLayout:
    raw_space: Leaf | Dict  # what the environment emits: the graph's inputs
    chw_keys: set[str | None]  # leaves the graph transposes from HWC to CHW
    images: list[ImageScaling]


def observation_layout(policy: Any, layout: ImageLayout) -> ObservationLayout:
    space = policy.observation_space
    items = space.spaces.items() if type(space).__name__ == "Dict" else [(None, space)]
    leaves = {key: _leaf(key, gym_leaf, policy, layout) for key, gym_leaf in items}
    return ObservationLayout(
        raw_space=_assembled(leaves),
        chw_keys={key for key, leaf in leaves.items() if leaf.transposed},
        images=[leaf.image for leaf in leaves.values() if leaf.image is not None],
    )


@dataclass(frozen=True)
class _RawLeaf:
    space: Leaf
    transposed: bool
    image: ImageScaling | None


def _assembled(leaves: dict[str | None, _RawLeaf]) -> Leaf | Dict:
    if None in leaves:
        return leaves[None].space
    return Dict(spaces={str(key): leaf.space for key, leaf in leaves.items()})


def _leaf(key: str | None, gym_leaf: Any, policy: Any, layout: ImageLayout) -> _RawLeaf:
    from stable_baselines3.common.preprocessing import is_image_space

    space = _described(key, gym_leaf)
    if not (isinstance(space, Box) and is_image_space(gym_leaf)):
        return _RawLeaf(space, transposed=False, image=None)
    transposed = layout is ImageLayout.HWC
    raw = _to_hwc(space) if transposed else space
    image = ImageScaling(
        key=key,
        layout="HWC" if transposed else "CHW",
        transposed_to_chw=transposed,
        scale=1 / 255 if policy.normalize_images else 1.0,
    )
    return _RawLeaf(raw, transposed=transposed, image=image)


def _described(key: str | None, gym_leaf: Any) -> Leaf:
    try:
        space = from_gymnasium(gym_leaf)
    except InvalidInput as exc:
        where = "observation_space" if key is None else f"observation_space[{key!r}]"
        raise ExportError(f"{where}: {exc.message}") from None
    if isinstance(space, Dict):
        raise ExportError("observation_space: nested Dict spaces are not supported")
    return space


def _to_hwc(space: Box) -> Box:
    low = np.transpose(space.low_array, (1, 2, 0))
    high = np.transpose(space.high_array, (1, 2, 0))
    return Box.from_arrays(low, high, space.dtype)
