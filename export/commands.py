"""``rlserve export sb3|torch ...``: export a trained policy with proven parity.

Progress goes to stderr; the parity table and the written path to stdout. Exit status 1
when parity fails (nothing is written), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from export.arguments import CommonArgs, Sb3Args, TorchArgs
from serve.cli.arguments import add_arguments as add_dataclass_arguments
from serve.cli.arguments import from_namespace

NAME = "export"
HELP = "export a trained PPO/A2C policy to ONNX with an embedded policy contract"
EXTRA = "export"

_SOURCES: dict[str, tuple[type[CommonArgs], str, str]] = {
    "sb3": (
        Sb3Args,
        "a Stable-Baselines3 PPO or A2C checkpoint (.zip)",
        "rlserve export sb3 ppo_pendulum.zip --vecnormalize vecnormalize.pkl \\\n"
        "    --name pendulum --model-repository models",
    ),
    "torch": (
        TorchArgs,
        "a CleanRL-style torch module returning (distribution, value)",
        "rlserve export torch agent.py:make_agent --checkpoint agent.pt --env CartPole-v1 \\\n"
        "    --name cartpole --model-repository models",
    ),
}
_DESCRIPTION = (
    "Export {what}. The graph maps raw observations to the deterministic action, the "
    "distribution's parameters and the value. Parity against the source runs before "
    "anything is written: on failure the table shows which output differs, the exit "
    "status is 1 and nothing is written."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name, (cls, what, example) in _SOURCES.items():
        child = sources.add_parser(
            name,
            help=what,
            description=textwrap.fill(_DESCRIPTION.format(what=what), width=78),
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_dataclass_arguments(child, cls)


def run(namespace: argparse.Namespace) -> int:
    from export import pipeline, writer

    cls, _, _ = _SOURCES[namespace.source]
    args: CommonArgs = from_namespace(cls, namespace)
    destination = writer.destination(args.model_repository, args.name, args.version)
    _progress(f"loading {namespace.source} policy")
    source = args.load_source()
    outcome = pipeline.export_policy(source, args.parity_settings(), destination, _progress)
    print(outcome.report.table())
    if outcome.path is None:
        _progress("parity failed: nothing was written")
        return 1
    print(f"wrote {outcome.path}")
    return 0


def _progress(message: str) -> None:
    print(f"rlserve export: {message}", file=sys.stderr, flush=True)
