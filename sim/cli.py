"""The ``pamsim`` command line.  Bare ``pamsim`` runs the main job on its default.

Subcommands live in ``sim/commands/`` (one module each, discovered at start-up).
Every user error ends in one line, ``pamsim <command>: error: ...``, and exit
status 2, before any work starts: option values are checked by the argparse
``type=`` validators below (shared by every command), combinations of options by
the command, which reports them with :func:`fail`.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import pkgutil
import sys
import tempfile
from pathlib import Path

import emu

#: What bare ``pamsim`` runs: the main job on its embedded default.
DEFAULT_ARGV = ["train"]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): ``pamsim <command>: error: ...``.
    Subcommand parsers inherit the class (``add_subparsers`` uses the parent's)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(args, message) -> int:
    """Report a bad combination of options of ``args.command`` as argparse would; exit 2."""
    print(f"pamsim {args.command}: error: {message}", file=sys.stderr)
    return 2


def format_arg(text: str):
    """argparse type for number formats (bf16, e8m4, float8_e4m3fn, ...)."""
    try:
        return emu.format(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def formats_arg(text: str) -> list:
    """argparse type: a comma-separated, non-empty list of number formats."""
    fmts = [format_arg(t) for t in text.split(",") if t.strip()]
    if not fmts:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected comma-separated formats, "
                                         "e.g. float32,bf16,e8m4")
    return fmts


def int_in(lo: int, hi: int | None = None):
    """argparse type: an integer in [lo, hi] (no upper bound when ``hi`` is None)."""
    accepted = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"got {text!r}; expected {accepted}")
        return v
    parse.__name__ = accepted
    return parse


positive_int = int_in(1)
nonneg_int = int_in(0)


def float_in(lo: float = -math.inf, hi: float = math.inf):
    """argparse type: a finite number in [lo, hi] (nan and inf are refused)."""
    accepted = ("a finite number" + ("" if lo == -math.inf else f" >= {lo:g}")
                if hi == math.inf else f"a number in [{lo:g}, {hi:g}]")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"got {text!r}; expected {accepted}")
        return v
    parse.__name__ = accepted
    return parse


def _writable(path: Path, want_dir: bool) -> Path:
    """``path`` if it can be written as a file (``want_dir``: a directory) without
    creating anything now: it is not the wrong kind, and its nearest existing ancestor
    is a writable directory (missing parents are made when the result is written)."""
    kind = "directory" if want_dir else "file"
    if path.exists() and path.is_dir() != want_dir:
        raise argparse.ArgumentTypeError(
            f"got {str(path)!r}, which is a {'file' if want_dir else 'directory'}; "
            f"expected a {kind} path to write")
    if path.is_file() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"got {str(path)!r}, a read-only file; expected a "
                                         f"{kind} path to write")
    base = path if want_dir else path.parent
    base = base.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"got {str(path)!r}: {str(base)!r} is a file, "
                                         f"not a directory; expected a {kind} path to write")
    try:        # a real write: os.access says yes to root on read-only file systems
        tempfile.TemporaryFile(dir=base).close()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"got {str(path)!r}: directory {str(base)!r} is not "
                                         f"writable ({exc.strerror}); expected a {kind} "
                                         "path to write") from None
    return path


def output_file(text: str) -> Path:
    """argparse type: a file path that can be written (checked before any work)."""
    if not text:
        raise argparse.ArgumentTypeError("got ''; expected a file path to write")
    return _writable(Path(text), want_dir=False)


def output_dir(text: str) -> Path:
    """argparse type: a directory that exists writable or can be made (checked before
    any work)."""
    if not text:
        raise argparse.ArgumentTypeError("got ''; expected a directory path to write")
    return _writable(Path(text), want_dir=True)


def build_parser() -> argparse.ArgumentParser:
    from . import commands
    p = Parser(
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
