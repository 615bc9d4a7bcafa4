"""``dsa-ops``: the console script. Each subcommand lives in ``dsa_ops/commands/<name>.py``
and defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. A bad
value (``dsa_ops.commands.checks.UsageError``) is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

COMMANDS = ("demo", "explain", "bench", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsa-ops",
        description="The DSA sparse-indexer top-k as torch.library ops, with a compile-pipeline backend policy.",
    )
    from dsa_ops import __version__

    parser.add_argument("--version", action="version", version=f"dsa-ops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        mod = importlib.import_module(f"dsa_ops.commands.{name}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dsa_ops.commands.checks import UsageError

    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:
        print(f"dsa-ops {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
