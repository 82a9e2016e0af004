"""The load test's own options, added to locust's command line and its web UI.

Each may also come from the environment (``LOCUST_P99_MS=150``) or a locust config file
(``p99-ms = 150``), like locust's own options. Contradictions stop locust before it starts.
``locust --help`` cannot list them (it prints before loading locustfiles, locust issue
#2917); ``python loadtests/_options.py`` does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from locust import events


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    _add(parser, "--model", default="", help="model to load; default: the server's first model")
    _add(parser, "--think-time-ms", type=float, default=0.0, help="closed loop: pause per answer")
    _add(
        parser, "--rate-per-user", type=float, default=0.0,
        help="open loop: requests/s per user (locust's constant_throughput); 0: closed loop",
    )  # fmt: skip
    parser.add_argument(
        "--deterministic", action="store_true", default=True,
        help="ask for the policy's deterministic action (the default)",
    )  # fmt: skip
    parser.add_argument(
        "--stochastic", dest="deterministic", action="store_false", include_in_web_ui=False,
        help="ask for a sampled action instead",
    )  # fmt: skip
    _add(parser, "--batch-rows", type=int, default=8, help="observations per vectorised request")
    _add(parser, "--p99-ms", type=float, default=200.0, help="gate: P99 of predict requests (ms)")
    _add(parser, "--max-fail-ratio", type=float, default=0.001, help="gate: failed / all predicts")


def _add(parser: Any, flag: str, **kwargs: Any) -> None:
    """add_argument, with the environment variable named after the flag."""
    env_var = "LOCUST_" + flag.removeprefix("--").replace("-", "_").upper()
    parser.add_argument(flag, env_var=env_var, **kwargs)


@dataclass(frozen=True)
class LoadOptions:
    model: str
    think_time_s: float
    rate_per_user: float
    deterministic: bool
    batch_rows: int
    p99_ms: float
    max_fail_ratio: float

    @classmethod
    def of(cls, environment: Any) -> LoadOptions:
        given = environment.parsed_options
        return cls(
            model=given.model,
            think_time_s=given.think_time_ms / 1000,
            rate_per_user=given.rate_per_user,
            deterministic=given.deterministic,
            batch_rows=given.batch_rows,
            p99_ms=given.p99_ms,
            max_fail_ratio=given.max_fail_ratio,
        )

    def problem(self) -> str | None:
        """What makes these options contradictory or meaningless, if anything."""
        if self.think_time_s < 0 or self.rate_per_user < 0:
            return "--think-time-ms and --rate-per-user cannot be negative"
        if self.think_time_s > 0 and self.rate_per_user > 0:
            return "choose --think-time-ms (closed loop) or --rate-per-user (open loop), not both"
        if self.batch_rows < 1:
            return "--batch-rows must be at least 1"
        return None


@events.init.add_listener
def _check_options(environment: Any, **_: Any) -> None:
    if environment.parsed_options is None:
        return  # locust used as a library: nothing was parsed
    problem = LoadOptions.of(environment).problem()
    if problem is not None:
        sys.exit(f"loadtests: {problem}")


if __name__ == "__main__":
    from locust.argument_parser import LocustArgumentParser

    parser = LocustArgumentParser(prog="locust -f loadtests/", add_config_file_help=False)
    _add_options(parser)
    parser.print_help()
