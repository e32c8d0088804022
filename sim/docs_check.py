"""Rerun the commands behind the figures of docs/ and compare with the docs.

docs/figures.toml registers every figure: the doc and a regex locating the documented
value(s) there (``at``), the command that produced them, a regex reading the same
values from the command's output (``read``; group i of ``read`` is compared with group
i of ``at``; absent: ``at`` itself, for a doc that quotes the output), a tolerance,
and what kind of figure it is:

* by default a value agrees when it rounds to the digits the doc prints (half a unit
  of the doc's last digit); ``tol`` an absolute tolerance instead (0: exact), ``rel`` a
  relative band (speed rows: the shared machine's timings move by up to ~40 %); text
  values compare exactly (whitespace and "–" for "-" aside);
* ``quick = true``: the command takes under a minute (``make docs-check`` reruns
  those; ``--all`` the others too);
* ``speed = true``: a timing (kept out of CI, which runs under unknown load);
* ``skip = "why"``: not rerunnable by this check (needs a CUDA GPU, a cold cache,
  ...): listed with the reason, never run.

``rows = [...]`` makes one figure per row of a table: ``{row}`` in ``name`` and
``command`` is the row's label, in ``at`` and ``read`` its regex-escaped text.

Each distinct command runs once per check, in out/docs-check/ (so its out/ files
land there), with the repository on PYTHONPATH; ``pamsim`` is this checkout's CLI.
One line per figure: ``ok``, ``DIFFERS: doc X, now Y``, or why it was not checked;
the exit status is 1 if any figure differs or its command failed.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "docs" / "figures.toml"
KEYS = {"name", "doc", "at", "command", "read", "tol", "rel", "quick", "speed", "skip", "rows"}


@dataclass
class Figure:
    name: str
    doc: str
    at: str
    command: str
    read: str = ""
    tol: float | None = None
    rel: float | None = None
    quick: bool = False
    speed: bool = False
    skip: str = ""
    documented: list[str] = field(default_factory=list)


def load(path: Path = REGISTRY) -> list[Figure]:
    """The registry, each figure's documented values read from its doc; a locator
    that does not match exactly once, or a malformed entry, raises ValueError."""
    entries = []
    for i, entry in enumerate(tomllib.loads(path.read_text())["figure"]):
        unknown = set(entry) - KEYS
        if unknown:
            raise ValueError(f"figure {i} ({entry.get('name')}): unknown keys {sorted(unknown)}")
        rows = entry.pop("rows", None)
        entries += [entry] if rows is None else [
            dict(entry, name=entry["name"].replace("{row}", row),
                 command=entry["command"].replace("{row}", row),
                 **{k: entry[k].replace("{row}", re.escape(row)) for k in ("at", "read") if k in entry})
            for row in rows]
    figures, docs = [], {}
    for entry in entries:
        fig = Figure(**entry)
        fig.read = fig.read or fig.at
        text = docs.setdefault(fig.doc, (ROOT / fig.doc).read_text())
        hits = list(re.finditer(fig.at, text, re.MULTILINE))
        if len(hits) != 1:
            raise ValueError(f"{fig.name}: locator matches {len(hits)} times in {fig.doc}")
        fig.documented = [g or "" for g in hits[0].groups()]   # an optional group: ''
        if not fig.documented or (fig.read and re.compile(fig.read).groups != len(fig.documented)):
            raise ValueError(f"{fig.name}: 'at' and 'read' need the same number (>= 1) of groups")
        figures.append(fig)
    return figures


def shown(values) -> str:
    return ", ".join(v or "''" for v in values)


def number(text: str) -> float | None:
    """A printed value as a number ('65,536', '1.72x', '97.21 %'), else None."""
    try:
        return float(text.replace(",", "").replace("−", "-").rstrip("x×% "))
    except ValueError:
        return None


def agrees(fig: Figure, doc: str, now: str) -> bool:
    a, b = number(doc), number(now)
    if a is None or b is None:
        return doc.replace("–", "-").split() == now.replace("–", "-").split()
    if fig.rel is not None:
        return abs(b - a) <= fig.rel * abs(a)
    if fig.tol is None:
        digits = doc.replace(",", "").replace("−", "-").rstrip("x×% ")
        tol = 0.5 * 10.0 ** Decimal(digits).as_tuple().exponent
    else:
        tol = fig.tol
    return abs(b - a) <= tol * (1 + 1e-9)


def run_command(command: str, workdir: Path) -> tuple[int, str, float]:
    # the repository's shipped examples are read in place; everything is written to workdir
    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(command)]
    if argv[0] == "pamsim":
        argv = [sys.executable, "-m", "sim.cli", *argv[1:]]
    elif argv[0] == "python":
        argv[0] = sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
               PAMSIM_MULTIPLIERS=str(workdir / "multipliers"))
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def check(figures: list[Figure], *, everything=False, speed=True, workdir=None,
          out=sys.stdout) -> int:
    """Rerun and compare; returns the number of figures that differ or failed."""
    def say(line):
        print(line, file=out, flush=True)
    workdir = Path(workdir or ROOT / "out" / "docs-check")
    workdir.mkdir(parents=True, exist_ok=True)
    results, bad = {}, 0
    for fig in figures:
        why = (fig.skip if fig.skip else
               "speed row" if fig.speed and not speed else
               "long: --all" if not (fig.quick or everything) else None)
        if why:
            say(f"skipped ({why})  {fig.name}: doc {shown(fig.documented)}")
            continue
        if fig.command not in results:
            results[fig.command] = run_command(fig.command, workdir)
            rc, _, secs = results[fig.command]
            say(f"# {fig.command}  (exit {rc}, {secs:.0f} s)")
        rc, text, _ = results[fig.command]
        hit = re.search(fig.read, text, re.MULTILINE)
        if rc != 0 or hit is None:
            bad += 1
            tail = text.strip().splitlines()[-1:] or [""]
            say(f"FAILED  {fig.name}: " + (f"exit {rc}: {tail[0]}" if rc else
                                            "its value is not in the output"))
            continue
        now = [g or "" for g in hit.groups()]
        if all(agrees(fig, d, n) for d, n in zip(fig.documented, now)):
            say(f"ok  {fig.name}: {shown(now)}")
        else:
            bad += 1
            say(f"DIFFERS  {fig.name}: doc {shown(fig.documented)}, now {shown(now)}")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.docs_check", description=__doc__.split("\n")[0])
    p.add_argument("--all", action="store_true", help="also the long figures (hours)")
    p.add_argument("--no-speed", action="store_true", help="skip the timing rows")
    p.add_argument("--doc", action="append", help="only the figures of this doc (repeatable)")
    p.add_argument("--match", action="append",
                   help="only figures whose name contains this text (repeatable)")
    p.add_argument("--list", action="store_true", help="list the figures and their commands")
    args = p.parse_args(argv)
    figures = [f for f in load()
               if (not args.doc or f.doc in args.doc or Path(f.doc).name in args.doc)
               and (not args.match or any(m in f.name for m in args.match))]
    if args.list:
        for f in figures:
            kind = "skip" if f.skip else "speed" if f.speed else "quick" if f.quick else "long"
            print(f"{kind:5}  {f.doc}  {f.name}: {shown(f.documented)}  <- {f.command}")
        return 0
    bad = check(figures, everything=args.all, speed=not args.no_speed)
    print(f"{len(figures)} figures, {bad} differ or failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
