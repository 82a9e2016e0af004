"""This checkout against another revision, side by side in one run: the request path's cost
before and after a change that should not move it (a restructuring, a refactor).

The revision is checked out once as a git worktree under ``.cache/bench-ab/``. For each
scenario, ``rlserve serve`` from each checkout serves the same exported model on the server
core, and wrk loads it from the other core, as ``python -m bench`` does; the two checkouts
take turns (``--rounds`` times, the order swapped every round) so that the machine's
drifts fall on both. Each server imports its own checkout's packages (it runs in that
folder, with it first on ``PYTHONPATH``).

    .venv/bin/python -m bench.ab --base e8730c6 [--only mlp-64,mlp-1,cartpole-64]
        [--rounds 3] [--seconds 5] [--warmup 1] [--access-log]

Like ``python -m bench``, the servers run without their access log, unless
``--access-log`` (the default of ``rlserve serve``) turns it on for both, written to each
server's log file.

Prints, per scenario and checkout, the median over rounds of requests/s, p50 and CPU µs per
request, and this checkout's ratio to the base (CPU µs per request: lower is better).
Needs wrk and taskset, like ``python -m bench``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import cpu, load, models, scenarios
from bench.scenarios import Scenario
from bench.servers import Server, only_model

ROOT = Path(__file__).resolve().parents[1]
WORKTREES = ROOT / ".cache" / "bench-ab"
DEFAULT = ("mlp-64", "mlp-1", "cartpole-64")


@dataclass(frozen=True)
class Checkout:
    name: str  # what the table calls it
    folder: Path

    def command(self) -> list[str]:
        """``rlserve`` as this checkout runs it (``python -m cli``, or before the command
        moved out of serve, ``python -m serve.cli``)."""
        module = "cli" if (self.folder / "cli" / "__init__.py").is_file() else "serve.cli"
        return [sys.executable, "-m", module]


@dataclass(frozen=True)
class Run:
    requests_per_s: float
    p50_ms: float
    cpu_us_per_request: float


def worktree(revision: str) -> Path:
    """``revision`` checked out under .cache/bench-ab (once)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", revision],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    folder = WORKTREES / commit
    if not (folder / "serve").is_dir():
        WORKTREES.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit],
            check=True, capture_output=True,
        )  # fmt: skip
    return folder


def measure(
    checkout: Checkout, repository: Path, scenario: Scenario, args: argparse.Namespace
) -> Run:
    """One server of ``checkout`` serving ``repository``, loaded as ``scenario`` says."""
    env = {"PYTHONPATH": str(checkout.folder)}
    if args.access_log:  # at level info: before 2026-12-07 the access log obeyed log_level
        env |= {"RLSERVE_ACCESS_LOG": "true", "RLSERVE_LOG_LEVEL": "info"}
    command = [*checkout.command(), "serve", "--model-repository", str(repository)]
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        server = Server(command, env, Path(tmp) / "server.log", cpu.SERVER_CORE, checkout.folder)
        try:
            server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
            url, body = f"{server.url}/predict", scenarios.body(scenario)
            load.post(url, body, scenario.connections, args.warmup)
            before = server.cpu_seconds()
            result = load.post(url, body, scenario.connections, args.seconds)
            spent = server.cpu_seconds() - before
        finally:
            server.stop()
    if result.requests == 0 or result.errors:
        raise RuntimeError(f"{checkout.name} {scenario.name}: {result}")
    return Run(result.requests_per_s, result.p50_ms, spent / result.requests * 1e6)


def compare(args: argparse.Namespace) -> list[str]:
    cpu.require_cores()
    load.require_wrk()
    here = Checkout("this checkout", ROOT)
    base = Checkout(f"base {args.base}", worktree(args.base))
    picked = [s for s in scenarios.WRK if s.name in args.only]
    exported = models.build_repository(
        ROOT / ".cache" / "bench" / "repository", scenarios.bench_models([s.name for s in picked])
    )
    lines = [
        "| scenario | checkout | requests/s | p50 ms | CPU µs/request | CPU vs base |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for scenario in picked:
        with tempfile.TemporaryDirectory(prefix="bench-ab-repo-") as tmp:
            repository = only_model(exported / scenario.model, Path(tmp))
            runs: dict[str, list[Run]] = {here.name: [], base.name: []}
            for round_ in range(args.rounds):
                order = (here, base) if round_ % 2 == 0 else (base, here)
                for checkout in order:
                    print(f"bench.ab: {scenario.name}: {checkout.name}", file=sys.stderr)
                    runs[checkout.name].append(measure(checkout, repository, scenario, args))
        lines += _rows(scenario, runs, base.name)
    return lines


def medians(runs: dict[str, list[Run]]) -> dict[str, Run]:
    """Each name's runs as one: the median of each figure over its rounds."""
    return {
        name: Run(*(statistics.median(getattr(r, f) for r in found) for f in Run.__annotations__))
        for name, found in runs.items()
    }


def _rows(scenario: Scenario, runs: dict[str, list[Run]], base: str) -> list[str]:
    rows = []
    by_name = medians(runs)
    for name, run in by_name.items():
        ratio = run.cpu_us_per_request / by_name[base].cpu_us_per_request
        rows.append(
            f"| {scenario.name} | {name} | {run.requests_per_s:,.0f} | {run.p50_ms:.2f} | "
            f"{run.cpu_us_per_request:.1f} | {ratio:.3f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument(
        "--only", type=lambda s: s.split(","), default=list(DEFAULT),
        help=f"wrk scenarios, comma-separated (default: {','.join(DEFAULT)})",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="turns of each checkout")
    parser.add_argument("--seconds", type=int, default=5, help="measured seconds per run")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per run")
    parser.add_argument(
        "--access-log", action="store_true",
        help="serve with the access log on (rlserve serve's default), as both checkouts write it",
    )  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    print("\n".join(compare(args)))


if __name__ == "__main__":
    main()
