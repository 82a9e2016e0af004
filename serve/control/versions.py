"""The resident versions of one model, and which one is active.

Requests that name no version run on whichever version is active *when their batch
forms*; activating another version is one assignment on the event loop, so it lands
between batches and no batch ever mixes versions.
"""

from __future__ import annotations

from serve.dataplane.model import ServedModel


class VersionTable:
    def __init__(self) -> None:
        self._resident: dict[int, ServedModel] = {}
        self._history: list[int] = []  # activations, oldest first
        self.active: int | None = None

    def add(self, model: ServedModel) -> None:
        self._resident[model.version] = model

    def activate(self, version: int) -> None:
        if version not in self._resident:
            raise KeyError(version)
        if version != self.active:
            self.active = version
            self._history.append(version)

    def get(self, version: int) -> ServedModel | None:
        return self._resident.get(version)

    @property
    def active_model(self) -> ServedModel | None:
        return None if self.active is None else self._resident[self.active]

    def resident(self) -> list[ServedModel]:
        return [self._resident[v] for v in sorted(self._resident)]

    def previous(self) -> int | None:
        """The most recently active version before the current one that is still resident."""
        for version in reversed(self._history[:-1]):
            if version in self._resident and version != self.active:
                return version
        return None

    def evict(self, keep: int, protected: set[int]) -> list[ServedModel]:
        """Unload all but the active version, the ``keep - 1`` most recently active others,
        and the ``protected`` ones (requests are still queued for them)."""
        recent = [v for v in reversed(self._history) if v in self._resident]
        order = list(dict.fromkeys([*([] if self.active is None else [self.active]), *recent]))
        kept = set(order[: max(keep, 1)]) | protected
        gone = [m for v, m in self._resident.items() if v not in kept]
        for model in gone:
            del self._resident[model.version]
        return gone
