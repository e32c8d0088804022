"""The ``pamsim`` command line.  Bare ``pamsim`` runs the main job on its default.

Subcommands live in ``sim/commands/`` (one module each, discovered at start-up).
Every user error ends in one line, ``pamsim <command>: error: ...``, and exit
status 2, before any work starts: option values are checked by the argparse
``type=`` validators below (shared by every command), combinations of options by
the command, which reports them with :func:`fail`.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import math
import os
import pkgutil
import re
import sys
import tempfile
from pathlib import Path

import emu

#: What bare ``pamsim`` runs: the main job on its embedded default, the digits MLP with
#: native float32, the exact product, PAM and L-Mul at bf16 (sim/warm.py warms its kernels).
#: --ops matmul: PAMConfig takes another multiplier than PAM for the matmuls only so far.
DEFAULT_ARGV = ["train", "--mul", "exact,pam,lmul"]


def shown(value, sep: str = ",") -> str:
    """A default or setting as help and file names show it: a format by its name, a
    collection joined by ``sep`` (sorted when unordered; empty: 'none')."""
    import emu.mx
    if isinstance(value, (emu.Format, emu.mx.MXFormat)):
        return value.name
    if isinstance(value, (set, frozenset)):
        value = sorted(value)
    if isinstance(value, (list, tuple)):
        return sep.join(shown(v) for v in value) or "none"
    return str(value)


def default_text(action) -> str | None:
    """How ``--help`` states an option's default; None where it has none to state (a
    flag, or None/'': the help text says what happens then)."""
    d = action.default
    if d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, str) and not d):
        return None
    return shown(d, " " if action.nargs in ("+", "*") else ",")


class DefaultsFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default as the parser holds it when the help is
    printed, so a later ``set_defaults`` shows too (the override is the one
    argparse.ArgumentDefaultsHelpFormatter makes)."""

    def _get_help_string(self, action):
        text = default_text(action)
        return action.help if text is None else \
            f"{action.help} (default: {text.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): ``pamsim <command>: error: ...``,
    and every default in the help (:class:`DefaultsFormatter`).  Subcommand parsers
    inherit the class (``add_subparsers`` uses the parent's)."""

    def __init__(self, *args, formatter_class=DefaultsFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

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


def multiplier_arg(text: str):
    """argparse type for one multiplier (emu.multiplier's names: pam, lmul+3,
    cpam2-unbiased, exact, ...)."""
    try:
        return emu.multiplier(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def mul_arg(text: str):
    """:func:`multiplier_arg`, or ``all`` (as the string; the command expands it)."""
    return text if text == "all" else multiplier_arg(text)


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
                if hi == math.inf else f"a finite number <= {hi:g}" if lo == -math.inf
                else f"a number in [{lo:g}, {hi:g}]")

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


def settings_tag(args, ignore=()) -> str:
    """'_<option>-<value>' for each option of ``args.command`` whose value is not its
    default, for output file names, so that runs that differ in any setting never share
    a file; ``ignore``: options already in the name or that change no result (where
    output goes, progress, threads).  A tag over 100 characters becomes a hash."""
    parts = []
    for a in args.parser._actions:          # argparse's options of the subcommand
        if not a.option_strings or a.dest in ignore or a.default is argparse.SUPPRESS:
            continue
        # a string default goes through type=, as argparse converts it
        default = a.type(a.default) if isinstance(a.default, str) and a.type else a.default
        value = getattr(args, a.dest)
        if value != default:
            name = a.option_strings[-1].lstrip("-")
            parts.append(name if value is True else f"{name}-{shown(value, '+')}")
    tag = re.sub(r"[^A-Za-z0-9._+=-]+", "-", "_".join(parts))
    if len(tag) > 100:
        tag = hashlib.sha256(tag.encode()).hexdigest()[:12]
    return f"_{tag}" if tag else ""


def _version() -> str:
    """The installed distribution's version; a checkout run with PYTHONPATH=. (the GPU
    machines have no package index) reads pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pamsim")
    except PackageNotFoundError:
        import tomllib
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"] + " (source checkout)"


def _unavailable(sub, name: str, why: str) -> None:
    """A command whose optional extra is missing: listed, and one line when run."""
    def run(args) -> int:
        return fail(args, why)
    # "+" prefixes: its options arrive as plain words, so any command line reaches run
    p = sub.add_parser(name, help=f"(unavailable here: {why})", add_help=False,
                       prefix_chars="+")
    p.add_argument("rest", nargs="*")
    p.set_defaults(run=run)


def build_parser() -> argparse.ArgumentParser:
    from . import commands
    p = Parser(
        prog="pamsim",
        description="Bit-accurate emulation of piecewise-affine arithmetic. Without a "
                    f"command, runs the main job: pamsim {' '.join(DEFAULT_ARGV)}")
    p.add_argument("--version", action="version", version=f"pamsim {_version()}")
    sub = p.add_subparsers(dest="command", metavar="command")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        try:
            importlib.import_module(f"{commands.__name__}.{mod.name}").register(sub)
        except (ImportError, RuntimeError) as exc:      # an optional extra is missing
            _unavailable(sub, mod.name.replace("_", "-"), str(exc).split("\n")[0])
    for cmd in sub.choices.values():        # for settings_tag
        cmd.set_defaults(parser=cmd)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        args = parser.parse_args(DEFAULT_ARGV)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
