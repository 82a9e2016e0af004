"""``rlserve verify MODEL.onnx``: re-run the contract's golden vectors with onnxruntime."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from serve import contract
from serve.cli.arguments import add_arguments as add_dataclass_arguments
from serve.cli.arguments import arg, from_namespace

NAME = "verify"
HELP = "prove a model file intact: re-run its golden vectors with onnxruntime alone"
EXTRA = None


@dataclass
class VerifyArgs:
    model: Path = field(metadata=arg("the model.onnx to verify", positional=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, VerifyArgs)


def run(namespace: argparse.Namespace) -> int:
    import onnxruntime as ort

    args = from_namespace(VerifyArgs, namespace)
    policy = contract.read(args.model)
    session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run_session(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    problems = contract.check_golden(policy, run_session)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"{args.model}: {len(problems)} golden check(s) failed; the file is not intact")
        return 1
    print(f"{args.model}: OK, {len(policy.golden)} golden vectors reproduced")
    return 0
