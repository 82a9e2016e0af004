"""``rlserve export sb3|torch|lm ...``: export a trained policy with proven parity.

Progress goes to stderr; the parity table and the written path to stdout. Exit status 1
when parity fails (nothing is written), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from dataclasses import dataclass

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import from_namespace
from export.arguments import CommonArgs, LmArgs, Sb3Args, TorchArgs

NAME = "export"
HELP = (
    "export a trained policy (Stable-Baselines3 PPO, A2C, SAC, TD3, DDPG, DQN; sb3-contrib "
    "QR-DQN, TQC, MaskablePPO, RecurrentPPO; a CleanRL-style torch module) or a DPO/GRPO "
    "language model to ONNX with an embedded policy contract, after proving parity"
)
EXTRA = "export"

_ACTOR_CRITIC_DESCRIPTION = (
    "Export {what}. The graph maps raw observations to the deterministic action, the "
    "distribution's parameters and the value. Parity against the source runs before "
    "anything is written: on failure the table shows which output differs, the exit "
    "status is 1 and nothing is written."
)
_LM_DESCRIPTION = (
    "Export {what}: Llama or Qwen2 architecture, full weights or a PEFT LoRA adapter merged "
    "into its base in float32. The version directory holds model.onnx (a decoder with a "
    "key/value cache and the contract in its metadata: EOS set, tokenizer, chat template, "
    "generation defaults, golden prompts), tokenizer.json and the source's tokenizer and "
    "generation configs. Parity runs before anything is written: greedy decoding on "
    "onnxruntime must give exactly the tokens transformers.generate gives on every prompt, "
    "log-probs of the greedy tokens and of given completions must agree within --atol, and "
    "a padded batch must match single-sequence calls. On failure the table shows what "
    "differed, the exit status is 1 and nothing is written; bad input exits 2."
)


@dataclass(frozen=True)
class _Source:
    args: type[CommonArgs] | type[LmArgs]
    what: str  # the subcommand's help, and its description's subject
    description: str  # a template of {what}
    examples: str


_LM = "lm"
_SOURCES: dict[str, _Source] = {
    "sb3": _Source(
        Sb3Args,
        "a Stable-Baselines3 or sb3-contrib checkpoint (.zip): PPO, A2C, SAC, TD3, DDPG, DQN, "
        "QR-DQN, TQC, MaskablePPO or RecurrentPPO",
        _ACTOR_CRITIC_DESCRIPTION,
        "rlserve export sb3 ppo_pendulum.zip --vecnormalize vecnormalize.pkl \\\n"
        "    --name pendulum --model-repository models",
    ),
    "torch": _Source(
        TorchArgs,
        "a CleanRL-style torch module returning (distribution, value)",
        _ACTOR_CRITIC_DESCRIPTION,
        "rlserve export torch agent.py:make_agent --checkpoint agent.pt --env CartPole-v1 \\\n"
        "    --name cartpole --model-repository models",
    ),
    _LM: _Source(
        LmArgs,
        "a causal language model as TRL's DPO or GRPO trainer wrote it (or a LoRA adapter)",
        _LM_DESCRIPTION,
        "rlserve export lm runs/dpo-qwen --name assistant --model-repository models\n"
        "  rlserve export lm runs/grpo-lora --base models/qwen-base --algorithm grpo \\\n"
        "      --name assistant --model-repository models",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name, source in _SOURCES.items():
        child = sources.add_parser(
            name,
            help=source.what,
            description=textwrap.fill(source.description.format(what=source.what), width=78),
            epilog=f"example:\n  {source.examples}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_dataclass_arguments(child, source.args)


def run(namespace: argparse.Namespace) -> int:
    from export import writer
    from export.actor_critic import pipeline

    if namespace.source == _LM:
        return _run_language_model(from_namespace(LmArgs, namespace))
    args = from_namespace(_SOURCES[namespace.source].args, namespace)
    assert isinstance(args, CommonArgs)
    destination = writer.destination(args.model_repository, args.name, args.version)
    progress = _Stages()
    progress(f"loading {namespace.source} policy")
    source = args.load_source()
    outcome = pipeline.export_policy(source, args.parity_settings(), destination, progress)
    print(outcome.report.table())
    if outcome.path is None:
        progress("parity failed: nothing was written")
        return 1
    progress.done()
    print(f"wrote {outcome.path}")
    return 0


def _run_language_model(args: LmArgs) -> int:
    from export import writer
    from export.lm import pipeline

    destination = writer.destination(args.model_repository, args.name, args.version)
    settings = args.parity_settings()
    progress = _Stages()
    progress(f"loading {args.checkpoint}")
    source = args.load_source()
    merged = f" + adapter {source.checkpoint.adapter.path}" if source.checkpoint.adapter else ""
    algorithm = source.algorithm.value if source.algorithm is not None else "none"
    progress(
        f"loaded {source.provenance.architecture} from {source.checkpoint.model.path}{merged}; "
        f"algorithm {algorithm} ({source.algorithm_evidence})"
    )
    outcome = pipeline.export_language_model(source, settings, destination, progress, args.graph)
    print(outcome.report.table())
    if outcome.path is None:
        progress("parity failed: nothing was written")
        return 1
    progress.done()
    print(f"wrote {outcome.path}")
    return 0


class _Stages:
    """Progress on stderr, one line per stage, each saying how long the stage before it
    took (``[+2.1 s]``), and a last line with the whole export's time."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        took = "" if now == self.started else f"[+{now - self.last:.1f} s] "
        print(f"rlserve export: {took}{message}", file=sys.stderr, flush=True)
        self.last = now

    def done(self) -> None:
        self(f"done in {time.monotonic() - self.started:.1f} s")
