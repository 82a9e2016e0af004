"""A decoding step alone, in process: what the onnxruntime call and the Python around it cost
per token, with a batch's cache in slots (grown in place) and copied at every step.

The ``lm`` scenario's model and prompts (bench/lm.py: the tiny DPO policy exported with
``rlserve export lm``, 16-token prompts), loaded as the server loads a version. Per round,
``--rows`` greedy sequences are prefilled and decoded together for ``--new-tokens`` each,
``ignore_eos``, streamed (their text handed out token by token, as a server stream's is);
the two caches take turns, round after round. Times are the thread's CPU time
(``time.thread_time``) of the steps (prefills not counted): every ``DecodeBatch.step``, and
the graph calls inside them (onnxruntime, from Python's call to its return). Prints a table
of µs per token.

    .venv/bin/python -m bench.lm_step [--rows 8] [--new-tokens 128] [--rounds 10]

Pin it to one core (``taskset -c 0``) to compare with the ``lm`` scenario's server.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench import lm
from serve import config
from serve.execution.runtime import CPU, Execution, Session, create_session
from serve.lm.batch import DecodeBatch
from serve.lm.decoder import GraphDecoder
from serve.lm.messages import GenerationSpec
from serve.lm.model import LanguageModel

BUDGET = 1 << 14  # max_batch_tokens, the server's default
T = TypeVar("T")


@dataclass
class Spent:
    """CPU seconds and tokens of one cache's steps; ``on`` while the steps run (prefills are
    not counted)."""

    step_s: float = 0.0
    graph_s: float = 0.0
    tokens: int = 0
    on: bool = False

    def per_token_us(self) -> tuple[float, float, float]:
        per = 1e6 / self.tokens
        return self.step_s * per, self.graph_s * per, (self.step_s - self.graph_s) * per

    def timed(self, call: Callable[..., T]) -> Callable[..., T]:
        """``call``, its CPU time counted while the steps run."""

        def counted(*args: Any) -> T:
            started = time.thread_time()
            result = call(*args)
            if self.on:
                self.graph_s += time.thread_time() - started
            return result

        return counted


def _models(model: LanguageModel, session: Session) -> dict[str, tuple[LanguageModel, Spent]]:
    """The version twice: its cache in slots (the default on the CPU), and copied at every
    step (a decoder given no binder), each graph call timed."""
    slots, copies = Spent(), Spent()

    def binder(inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> Any:
        return slots.timed(session.bind(inputs, outputs))

    decoders = {
        "cache in slots": (GraphDecoder(session.run, model.contract, binder), slots),
        "cache copied": (GraphDecoder(copies.timed(session.run), model.contract), copies),
    }
    return {name: (_twin(model, decoder), spent) for name, (decoder, spent) in decoders.items()}


def _twin(model: LanguageModel, decoder: GraphDecoder) -> LanguageModel:
    """The same version over another decoder."""
    c = model
    return LanguageModel(
        c.name, c.version, c.contract, decoder, c.codec, c.sha256, c.provider_report
    )


def _round(model: LanguageModel, texts: Sequence[str], new_tokens: int, spent: Spent) -> None:
    """One batch of ``len(texts)`` sequences decoded to their end, its steps counted."""
    batch: DecodeBatch[int] = DecodeBatch(model.decoder, tokens=BUDGET)
    for index, text in enumerate(texts):
        spec = GenerationSpec(
            text, None, new_tokens, 0.0, None, None, None, (), "bench", 0.0, float("inf"),
            ignore_eos=True,
        )  # fmt: skip
        batch.prefill(index, model.sequence(model.prepare_generation(spec), streamed=True))
    spent.on = True
    started = time.thread_time()
    while len(batch):
        spent.tokens += len(batch.step())
    spent.step_s += time.thread_time() - started
    spent.on = False


def measure(
    model: LanguageModel, session: Session, texts: Sequence[str], new_tokens: int, rounds: int
) -> dict[str, Spent]:
    models = _models(model, session)
    for twin, _ in models.values():  # a warm-up round each, not counted
        _round(twin, texts, new_tokens, Spent())
    for _ in range(rounds):  # the caches take turns
        for twin, spent in models.values():
            _round(twin, texts, new_tokens, spent)
    return {name: spent for name, (_, spent) in models.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="sequences decoded together")
    parser.add_argument("--new-tokens", type=int, default=lm.NEW_TOKENS)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per cache, alternating")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lm-step-") as work:
        folder = lm.export(lm.policy(), Path(work) / "repository")
        version = folder / "1"
        session = create_session(
            version / "model.onnx", config.load(providers=[CPU]), f"{lm.POLICY}/1",
            execution=Execution.RUN,
        )  # fmt: skip
        model = LanguageModel.load(lm.POLICY, 1, version, session, "0" * 64)
        texts = lm.exact_prompts(folder)[0][: args.rows]
        spent = measure(model, session, texts, args.new_tokens, args.rounds)
    print(f"\n{args.rows} sequences, {args.new_tokens} new tokens each, {args.rounds} rounds")
    print("| per token | " + " | ".join(spent) + " |")
    print("|---|" + "---:|" * len(spent))
    rows = [s.per_token_us() for s in spent.values()]
    labels = ("a whole step", "- the graph call (onnxruntime)", "- Python around it")
    for index, label in enumerate(labels):
        print(f"| {label} | " + " | ".join(f"{r[index]:.1f} µs" for r in rows) + " |")


if __name__ == "__main__":
    main()
