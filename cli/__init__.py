"""The ``rlserve`` command: one entry point, one module per subcommand, and the command-line
plumbing every package's commands share (``cli.arguments``: flags from a dataclass;
``cli.settings_arguments``: flags from pydantic settings).

A subcommand module exposes ``NAME``, ``HELP``, ``EXTRA`` (the pip extra its work needs,
or ``None``), ``add_arguments(parser)`` and ``run(args) -> int``. It imports heavy
dependencies (torch, the server) inside ``run`` only, so ``rlserve --help`` works on any
install, and a subcommand whose extra is missing says which one to install.

Exit status: 0 success, 1 a check failed (parity, golden vectors), 2 a usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from kernel import __version__
from kernel.errors import RLServeError

# Resolved by name, so that `rlserve --help` imports no package's heavy dependencies and
# no package imports another's commands.
_SUBCOMMANDS = (
    "serve.commands.serve",
    "export.commands",
    "serve.commands.inspect",
    "serve.commands.verify",
    "ops.commands.rollout",
    "loop.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlserve",
        description="Export trained RL policies to ONNX with a policy contract, and serve them.",
    )
    parser.add_argument("--version", action="version", version=f"rlserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        command = importlib.import_module(name)
        child = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        command.add_arguments(child)
        child.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: ModuleType = args._command
    try:
        return int(command.run(args))
    except RLServeError as exc:
        print(f"rlserve {command.NAME}: error: {exc.message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if command.EXTRA is None:
            raise
        print(
            f"rlserve {command.NAME}: error: needs the {command.EXTRA!r} extra (missing module "
            f"{exc.name!r}); install it with: pip install 'rlserve[{command.EXTRA}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"rlserve {command.NAME}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the output went to `head` or similar, which stopped reading
        sys.stderr.close()
        return 0
