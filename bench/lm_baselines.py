"""The language-model benchmark's reference points, each measured in its own process (the
``lm`` scenario starts them pinned to the server's core); each prints one JSON line.

    python -m bench.lm_baselines transformers --model DIR --prompts FILE --new-tokens N \\
        [--seconds S]
    python -m bench.lm_baselines genai --model DIR --genai-dir DIR --prompts FILE \\
        --new-tokens N --batch B [--seconds S]

``transformers``: ``model.generate`` on the source directory, one prompt after another,
greedy, exactly ``new_tokens`` new tokens each (EOS does not stop it): what a team gets
from the training framework alone. ``genai``: onnxruntime-genai's own generator over a
static batch of ``batch`` prompts (its model builder exports the source directory into
``genai_dir`` first, once: fp32, CPU), exactly ``new_tokens`` each: the in-process ceiling
on this CPU, with no server, no HTTP and no joining or leaving mid-batch. Both go through
the prompts (one at a time, or ``batch`` at a time), again from the first when they are
done, until ``seconds`` have passed (one call at least), after a short warm-up call.

The prompts file is JSON: a list of token-id lists, all of one length (a static batch needs
equal lengths without padding tricks). Both take one thread for torch / onnxruntime's
intra-op pool, like the server's default of one per core. Output: requests, tokens,
seconds, tokens_per_s, and per-request time-to-first-token for the sequential run (one
new token: the prefill and its first choice).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WARMUP_TOKENS = 4
Rows = list[list[int]]


@dataclass
class Throughput:
    engine: str
    requests: int
    new_tokens: int  # per request
    tokens: int  # generated, all requests
    seconds: float
    batch: int = 1
    ttft_s: list[float] = field(default_factory=list)  # per request, sequential runs only

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


def until(seconds: float, waves: list[Rows], run: Callable[[Rows], int]) -> tuple[int, int, float]:
    """``run`` each wave in order, again from the first, until ``seconds`` have passed
    (one wave at least): requests (rows), tokens generated, seconds spent."""
    requests = tokens = 0
    started = time.perf_counter()
    for rows in itertools.cycle(waves):
        tokens += run(rows)
        requests += len(rows)
        if time.perf_counter() - started >= seconds:
            break
    return requests, tokens, time.perf_counter() - started


def transformers_sequential(
    model_dir: Path, prompts: Rows, new_tokens: int, seconds: float
) -> Throughput:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]

    def generate(ids: list[int], tokens: int) -> int:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return int(out.shape[1]) - len(ids)

    generate(prompts[0], WARMUP_TOKENS)
    ttft: list[float] = []
    for ids in prompts:
        started = time.perf_counter()
        generate(ids, 1)
        ttft.append(time.perf_counter() - started)
    waves = [[ids] for ids in prompts]
    requests, tokens, spent = until(seconds, waves, lambda rows: generate(rows[0], new_tokens))
    return Throughput("transformers", requests, new_tokens, tokens, spent, ttft_s=ttft)


def build_genai(model_dir: Path, genai_dir: Path) -> Path:
    """onnxruntime-genai's export of ``model_dir`` (fp32, CPU, one intra-op thread), built
    once."""
    if (genai_dir / "genai_config.json").is_file():
        return genai_dir
    config = json.loads((model_dir / "config.json").read_text())
    family = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
    architecture = config["architectures"][0]
    if architecture not in family:
        raise SystemExit(f"{model_dir}: no onnxruntime-genai baseline for {architecture}")
    # The builder's Python entry wants its own option parsing first: run it as a module.
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
    subprocess.run(
        [*builder, "-m", family[architecture], "-i", str(model_dir), "-o", str(genai_dir),
         "-p", "fp32", "-e", "cpu", "-c", str(genai_dir.parent / "genai-cache")],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    path = genai_dir / "genai_config.json"
    settings = json.loads(path.read_text())
    settings["model"]["decoder"]["session_options"]["intra_op_num_threads"] = 1
    path.write_text(json.dumps(settings, indent=4))
    return genai_dir


def genai_static(
    genai_dir: Path, prompts: Rows, new_tokens: int, batch: int, seconds: float
) -> Throughput:
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(genai_dir))
    length = len(prompts[0])

    def wave(rows: Rows, tokens: int) -> int:
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=length + tokens, min_length=length + tokens, batch_size=len(rows),
            do_sample=False,
        )  # fmt: skip
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(rows, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return sum(len(generator.get_sequence(i)) - length for i in range(len(rows)))

    wave(prompts[:batch], WARMUP_TOKENS)
    waves = [prompts[i : i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
    requests, tokens, spent = until(seconds, waves, lambda rows: wave(rows, new_tokens))
    return Throughput("onnxruntime-genai", requests, new_tokens, tokens, spent, batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("engine", choices=["transformers", "genai"])
    parser.add_argument("--model", type=Path, required=True, help="the source model directory")
    parser.add_argument("--genai-dir", type=Path, help="where onnxruntime-genai's export goes")
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of id lists")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="genai: the static batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="measure at least this long")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    prompts = json.loads(args.prompts.read_text())
    if len({len(p) for p in prompts}) != 1:
        parser.error(f"{args.prompts}: every prompt must have the same length")
    if args.engine == "transformers":
        result = transformers_sequential(args.model, prompts, args.new_tokens, args.seconds)
    else:
        if args.genai_dir is None:
            parser.error("genai needs --genai-dir")
        if len(prompts) < args.batch:
            parser.error(f"{args.prompts}: {len(prompts)} prompts, fewer than --batch")
        genai_dir = build_genai(args.model, args.genai_dir)
        result = genai_static(genai_dir, prompts, args.new_tokens, args.batch, args.seconds)
    print(json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
