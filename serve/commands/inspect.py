"""``rlserve inspect MODEL.onnx``: print the policy contract embedded in a model."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from serve import contract
from serve.cli.arguments import add_arguments as add_dataclass_arguments
from serve.cli.arguments import arg, from_namespace

NAME = "inspect"
HELP = "print the policy contract embedded in an exported model"
EXTRA = None


@dataclass
class InspectArgs:
    model: Path = field(metadata=arg("the model.onnx to read", positional=True))
    json: bool = field(default=False, metadata=arg("print the contract as JSON"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, InspectArgs)


def run(namespace: argparse.Namespace) -> int:
    args = from_namespace(InspectArgs, namespace)
    policy = contract.read(args.model)
    if args.json:
        print(json.dumps(json.loads(policy.to_json()), indent=2))
        return 0
    print(summary(policy))
    return 0


def summary(policy: contract.PolicyContract) -> str:
    src = policy.source
    prep = policy.preprocessing
    norm = prep.normalization
    lines = [
        f"schema          {contract.SCHEMA}",
        f"algorithm       {policy.algorithm.value} ({policy.kind})",
        f"policy version  {policy.policy_version}",
        f"source          {src.framework} {src.framework_version}, {src.policy_class}",
        f"checkpoint      {src.checkpoint} sha256:{src.sha256}",
        f"exporter        {policy.exporter.name} {policy.exporter.version}, opset {policy.opset}",
        f"created         {policy.created_at}",
        f"observations    {policy.observation_space.model_dump_json()}",
        f"actions         {policy.action_space.model_dump_json()}",
        f"distribution    {policy.distribution.kind.value}",
        "normalisation   "
        + (f"baked in (clip {norm.clip}, eps {norm.epsilon:g})" if norm else "none"),
        "images          "
        + (", ".join(f"{i.key or 'obs'}: {i.layout} x{i.scale:g}" for i in prep.images) or "none"),
        f"action clip     {'baked in' if prep.action_clip else 'none'}",
        "inputs",
        *(f"  {t.name:<14}{t.role.value:<13}{t.dtype:<9}{t.shape}" for t in policy.inputs),
        "outputs",
        *(f"  {t.name:<14}{t.role.value:<13}{t.dtype:<9}{t.shape}" for t in policy.outputs),
        f"golden vectors  {len(policy.golden)} (atol {policy.golden_atol:g})",
    ]
    return "\n".join(lines)
