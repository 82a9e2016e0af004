"""What serving with a policy canary costs per request (issue 45's target: at most 5% more
CPU than serving without one).

One ``rlserve serve`` process on the server core serves the bundled CartPole policy as
version 1 and the same file as version 2; wrk on the other core sends cartpole-64's body
(64 connections) in four conditions, taking turns ``--rounds`` times (the order rotated
every round) so that the machine's drifts fall on all four:

- *no canary*: version 1 serves every call;
- *no canary, keyed*: the same, every request naming its episode (``X-Episode-Key``):
  64 actors' episodes of ``EPISODE_STEPS`` calls each;
- *canary, keyed*: version 2 is a canary on ``SHARE`` of episodes, the requests naming
  their episodes as above;
- *canary, unkeyed*: the same canary; requests name no key, so every call is drawn.

The canary is started and rolled back through the admin API between runs, in the same
server process. Writes the section "Policy canary" of ``--output`` (docs/benchmarks.md; a
run of ``python -m bench`` keeps it) and prints its table: requests/s, p50, the server's
CPU µs per request (the median over rounds) and, for each canary, that over the same calls'
without one.

    .venv/bin/python -m bench.canary [--seconds 5] [--rounds 3] [--output docs/benchmarks.md]

Needs wrk and taskset and two cores, as ``python -m bench`` does.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

from bench import cpu, load, report, scenarios
from bench.ab import Run, medians
from bench.servers import Server

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "model_repository" / "cartpole" / "1" / "model.onnx"
TOKEN = "bench-canary-token"
SHARE = 0.1
TARGET = 1.05  # CPU per request with a canary, over without
CONDITIONS = ("no canary", "no canary, keyed", "canary, keyed", "canary, unkeyed")
WITHOUT = {"canary, keyed": "no canary, keyed", "canary, unkeyed": "no canary"}
# 64 actors' episodes of EPISODE_STEPS calls each: wrk's one thread sends its connections'
# calls about in turn, so call n is about actor n % 64's, in its episode n // (64 x steps)
EPISODE_STEPS = 200
KEYED = f"""
local n = 0
request = function()
  n = n + 1
  local episode = math.floor(n / {64 * EPISODE_STEPS})
  wrk.headers["X-Episode-Key"] = "actor-" .. (n % 64) .. "/episode-" .. episode
  return wrk.format()
end
"""


def repository(folder: Path) -> Path:
    """cartpole/1 and cartpole/2: the demo's file twice."""
    for version in (1, 2):
        (folder / "cartpole" / str(version)).mkdir(parents=True)
        shutil.copy(DEMO, folder / "cartpole" / str(version) / "model.onnx")
    (folder / "cartpole" / "config.yaml").write_text("version_policy:\n  specific: [1]\n")
    return folder


def measure(server: Server, condition: str, args: argparse.Namespace) -> Run:
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    with admin:
        if condition.startswith("canary"):
            started = admin.post("/v1/models/cartpole/canary", json={"version": 2, "share": SHARE})
            started.raise_for_status()
        try:
            url = f"{server.url}/predict"
            body = scenarios.body(_cartpole())
            lua = KEYED if condition.endswith(", keyed") else ""
            load.post(url, body, 64, args.warmup, lua=lua)
            before = server.cpu_seconds()
            result = load.post(url, body, 64, args.seconds, lua=lua)
            spent = server.cpu_seconds() - before
        finally:
            if condition.startswith("canary"):
                admin.post("/v1/models/cartpole/canary/rollback").raise_for_status()
    if result.requests == 0 or result.errors:
        raise RuntimeError(f"{condition}: {result}")
    return Run(result.requests_per_s, result.p50_ms, spent / result.requests * 1e6)


# What a profile of these runs shows (py-spy, and the batch metrics of one run of each):
# written under every table, as it explains the rows rather than one run's numbers.
WHERE_THE_TIME_GOES = (
    "Where the time goes: a batch never mixes versions, so a canary's rows form their own "
    "batches, small ones (2.6 to 4.4 rows against the live version's 19 to 21 at 64 "
    "connections: 50 to 75% more batches, each paying a batch's fixed cost and the event "
    "loop's turns around it); each call's side costs a dictionary lookup of its key (a "
    "hash the first time), or a random draw without one, and a count kept until the next "
    "metrics flush (about 2% together in a profile). This machine's runs move by several "
    "percent from one to the next even in turns: the same four conditions measured 1.007 "
    "and 1.071 (keyed), 1.062 and 1.220 (unkeyed) in two earlier runs of the day."
)


def section(lines: list[str], args: argparse.Namespace) -> str:
    """The document's section: what was run, when, and the table."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = f"python -m bench.canary --rounds {args.rounds} --seconds {args.seconds}"
    return "\n".join(
        [
            report.MEASURED_BY_CANARY,
            "",
            f"Measured by `{command}` on {when} ({platform.machine()}, {os.cpu_count()} CPUs): "
            "one `rlserve serve` on core 0 serving the bundled CartPole policy as versions 1 "
            "and 2, wrk on core 1 at 64 connections with cartpole-64's body, four conditions "
            f"in turns, the median of {args.rounds} rounds. A canary serves {SHARE:g} of "
            "episodes; keyed requests name 64 actors' episodes of "
            f"{EPISODE_STEPS} calls each ([rollouts.md](rollouts.md#what-a-canary-costs)).",
            "",
            *lines,
            "",
            WHERE_THE_TIME_GOES,
            "",
        ]
    )


def compare(args: argparse.Namespace) -> list[str]:
    cpu.require_cores()
    load.require_wrk()
    runs: dict[str, list[Run]] = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="bench-canary-") as tmp:
        repo = repository(Path(tmp) / "repository")
        command = [sys.executable, "-m", "cli", "serve", "--model-repository", str(repo)]
        env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_ACCESS_LOG": "false"}
        server = Server(command, env, Path(tmp) / "server.log", cpu.SERVER_CORE)
        try:
            server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
            for round_ in range(args.rounds):
                shift = round_ % len(CONDITIONS)
                for condition in CONDITIONS[shift:] + CONDITIONS[:shift]:
                    print(f"bench.canary: round {round_ + 1}: {condition}", file=sys.stderr)
                    runs[condition].append(measure(server, condition, args))
        finally:
            server.stop()
    return _table(runs)


def _table(runs: dict[str, list[Run]]) -> list[str]:
    """Each condition's medians; a canary's CPU over the same requests' without one."""
    by_name = medians(runs)
    lines = [
        "| condition | requests/s | p50 ms | CPU µs/request | CPU vs the same calls, no canary |",
        "|---|---:|---:|---:|---:|",
    ]
    ratios = []
    for name, run in by_name.items():
        ratio = ""
        if name in WITHOUT:
            share = run.cpu_us_per_request / by_name[WITHOUT[name]].cpu_us_per_request
            ratios.append(share)
            ratio = f"{share:.3f}"
        lines.append(
            f"| {name} | {run.requests_per_s:,.0f} | {run.p50_ms:.2f} | "
            f"{run.cpu_us_per_request:.1f} | {ratio} |"
        )
    verdict = "met" if max(ratios) <= TARGET else "missed"
    lines.append("")
    lines.append(f"Target: CPU per request with a canary <= {TARGET:g}x without: {verdict}.")
    return lines


def _cartpole() -> scenarios.Scenario:
    (found,) = [s for s in scenarios.WRK if s.name == "cartpole-64"]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.canary", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--rounds", type=int, default=3, help="turns of each condition")
    parser.add_argument("--seconds", type=int, default=5, help="measured seconds per run")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per run")
    parser.add_argument(
        "--output", type=Path, default=ROOT / "docs" / "benchmarks.md",
        help="the benchmarks document whose Policy canary section to write",
    )  # fmt: skip
    args = parser.parse_args(argv)
    lines = compare(args)
    print("\n".join(lines))
    document = args.output.read_text() if args.output.is_file() else "# Benchmarks\n"
    args.output.write_text(
        report.put_section(document, report.MEASURED_BY_CANARY, section(lines, args))
    )
    print(f"bench.canary: wrote its section of {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
