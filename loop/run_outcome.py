"""What a training run leaves behind, said at its end: the last and the best versions it
published, what each earned, where they are and the command that serves them.

A trainer calls :meth:`RunOutcome.published` after each version it pushes, with the score
it measured then (PPO: the mean return of the last 100 episodes; GRPO: the window's mean
reward), and prints :meth:`RunOutcome.lines` when it stops, whether it reached its target
or not: a run that ends "below the target" still says where its versions are.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunOutcome:
    model: str
    score: str  # what the score is, for the lines: "mean return (last 100 episodes)"
    repository: Path | None  # the served repository, when the run knows it
    server: str  # the server the versions were pushed to
    scores: dict[int, float] = field(default_factory=dict)  # by version: the score then

    def published(self, version: int, score: float | None) -> None:
        """``version`` is served now; ``score`` is what the run measured when it was made
        (None before any episode or reward was seen)."""
        if score is not None:
            self.scores[version] = score

    def lines(self, last_version: int) -> list[str]:
        """The run's last words: the last and the best versions, what each scored, and the
        command that serves each."""
        said = [self._line("last", last_version)]
        if self.scores:
            best = max(self.scores, key=lambda v: (self.scores[v], v))
            if best != last_version:
                said.append(self._line("best", best))
        return said

    def _line(self, which: str, version: int) -> str:
        score = self.scores.get(version)
        scored = "" if score is None else f": {self.score} {score:.2f} when it was published"
        if self.repository is None:
            where = (
                f"; {self.server} serves it (or served it: every pushed version is in that "
                "server's model repository, <repository>/"
                f"{self.model}/{version}/model.onnx)"
            )
        else:
            path = self.repository / self.model / str(version) / "model.onnx"
            where = f"; serve it alone: .venv/bin/rlserve serve {shlex.quote(str(path))}"
        return f"{which} version {version} of {self.model}{scored}{where}"
