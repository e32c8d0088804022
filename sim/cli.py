"""The ``pamsim`` command line.  Bare ``pamsim`` runs the main job on its default.

Subcommands live in ``sim/commands/`` (one module each, discovered at start-up).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import emu

#: What bare ``pamsim`` runs: the main job on its embedded default.
DEFAULT_ARGV = ["train"]


def format_arg(text: str):
    """argparse type for number formats (bf16, e8m4, float8_e4m3fn, ...)."""
    try:
        return emu.format(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from . import commands
    p = argparse.ArgumentParser(
        prog="pamsim",
        description="Bit-accurate emulation of piecewise-affine arithmetic. Without a "
                    f"command, runs the main job: pamsim {' '.join(DEFAULT_ARGV)}")
    sub = p.add_subparsers(dest="command", metavar="command")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{mod.name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(DEFAULT_ARGV)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
