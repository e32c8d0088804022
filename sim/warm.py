"""The set-up's warm-up: every kernel the main job (bare ``pamsim``) and the README's
Python examples use, compiled once into Numba's on-disk cache, so that a fresh clone's
first ``make run`` times training, not compiling (``make setup`` runs
``python -m sim.warm``; tests/test_readme.py runs the same examples)."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_examples(path: Path = README) -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


def main() -> None:
    from sim.cli import DEFAULT_ARGV
    from sim.cli import main as pamsim
    for block in readme_examples():
        exec(compile(block, str(README), "exec"), {})
    # the main job, a few steps of each run (its PAM run is plain `pamsim train`)
    with tempfile.TemporaryDirectory() as out:
        pamsim([*DEFAULT_ARGV, "--epochs", "1", "--max-steps", "3", "--quiet", "--out", out])


if __name__ == "__main__":
    main()
