"""A run's last words (loop/run_outcome.py): the last and the best versions, their scores,
where they are and the command that serves each."""

from __future__ import annotations

from pathlib import Path

from loop.run_outcome import RunOutcome

SCORE = "mean return (last 100 episodes)"


def test_the_last_and_the_best_version_each_with_its_command() -> None:
    outcome = RunOutcome("cartpole", SCORE, Path("models"), "http://127.0.0.1:8000")
    for version, score in ((2, 30.0), (3, 250.5), (4, 200.0)):
        outcome.published(version, score)
    assert outcome.lines(4) == [
        "last version 4 of cartpole: mean return (last 100 episodes) 200.00 when it was "
        "published; serve it alone: .venv/bin/rlserve serve models/cartpole/4/model.onnx",
        "best version 3 of cartpole: mean return (last 100 episodes) 250.50 when it was "
        "published; serve it alone: .venv/bin/rlserve serve models/cartpole/3/model.onnx",
    ]


def test_the_best_is_not_repeated_when_it_is_the_last() -> None:
    outcome = RunOutcome("cartpole", SCORE, Path("models"), "http://127.0.0.1:8000")
    outcome.published(2, 10.0)
    outcome.published(3, 20.0)
    assert len(outcome.lines(3)) == 1


def test_without_the_repository_the_server_is_named() -> None:
    outcome = RunOutcome("cartpole", SCORE, None, "http://127.0.0.1:8000")
    outcome.published(2, None)  # no episode had ended yet
    (line,) = outcome.lines(2)
    assert line.startswith("last version 2 of cartpole; http://127.0.0.1:8000 serves it")
    assert "<repository>/cartpole/2/model.onnx" in line
