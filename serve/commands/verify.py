"""``rlserve verify MODEL.onnx``: re-run the contract's golden checks with onnxruntime alone.

An actor-critic's golden vectors are fed through the graph; a language model's golden
prompts are decoded greedily (``kernel.lm.greedy``, numpy) and must give the recorded tokens
and log-probs, and its tokenizer beside ``model.onnx`` must load, as the server checks when
it loads the version. Neither needs torch or transformers.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import arg, from_namespace
from kernel import contract
from kernel.errors import ModelLoadError
from kernel.lm import contract as lm_contract
from kernel.lm import greedy
from serve.commands import inspect

NAME = "verify"
HELP = "prove a model file intact: re-run its golden vectors (or prompts) with onnxruntime alone"
EXTRA = None


@dataclass
class VerifyArgs:
    model: Path = field(metadata=arg("the model.onnx to verify", positional=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, VerifyArgs)


def run(namespace: argparse.Namespace) -> int:
    args = from_namespace(VerifyArgs, namespace)
    policy = inspect.read(args.model)
    run_session = _session(args.model)
    if isinstance(policy, lm_contract.LanguageModelContract):
        problems = _language_model_problems(args.model, policy, run_session)
        checked = f"{len(policy.golden)} golden prompts"
    else:
        problems = contract.check_golden(policy, run_session)
        checked = f"{len(policy.golden)} golden vectors"
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"{args.model}: {len(problems)} golden check(s) failed; the file is not intact")
        return 1
    print(f"{args.model}: OK, {checked} reproduced")
    return 0


def _session(model: Path) -> contract.Runner:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run_session(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return run_session


def _language_model_problems(
    model: Path, policy: lm_contract.LanguageModelContract, run_session: contract.Runner
) -> list[str]:
    """What the server would refuse at load: a tokenizer that does not load, golden prompts
    that do not reproduce."""
    from serve.lm.text import TextCodec

    problems = []
    try:
        TextCodec.load(model.parent, policy, str(model))
    except ModelLoadError as exc:
        problems.append(exc.message)
    return problems + greedy.check_golden(policy, run_session)
