"""docs/figures.toml and sim/docs_check.py: every registered figure is found in its doc,
the check reports a difference, and the quick deterministic figures reproduce."""
import io
import json

import pytest

from sim import docs_check as D

#: The quick deterministic commands CI reruns (tens of seconds in all on a warm cache);
#: the other quick ones (MiniLM, RTL simulations, training) and every speed row run in
#: `make docs-check`.
CI_COMMANDS = ("pamsim cost ", "pamsim fewbit-tables --report", "pamsim memory-errors",
               "python -c \"import emu, math;", "python -c \"import costs.analytic")


def test_every_figure_is_located_in_its_doc():
    figures = D.load()
    assert len(figures) > 50
    for f in figures:
        assert f.documented and f.command, f.name
        assert f.rel is None or f.speed, f"{f.name}: a relative band is for speed rows"


def _registry(tmp_path, printed, **extra):
    doc = tmp_path / "doc.md"
    doc.write_text("The answer is 1.25 (`python -c ...`), and the ratio 2.0x.\n")
    lines = [f"{k} = {json.dumps(v)}"
             for k, v in dict(name="answer", doc=str(doc), at=r"answer is ([\d.]+)",
                              command=f"python -c \"print('value {printed}')\"",
                              read=r"value ([\d.]+)", quick=True, **extra).items()]
    reg = tmp_path / "figures.toml"
    reg.write_text("[[figure]]\n" + "\n".join(lines) + "\n")
    return D.load(reg)


@pytest.mark.parametrize("printed, extra, bad", [
    ("1.25", {}, 0),
    ("1.254", {}, 0),                   # rounds to the doc's 1.25
    ("1.256", {}, 1),
    ("1.3", {"tol": 0.06}, 0),
    ("1.3", {"tol": 0.0}, 1),
    ("1.6", {"rel": 0.3, "speed": True}, 0),
    ("1.8", {"rel": 0.3, "speed": True}, 1),
])
def test_check_compares_within_the_tolerance(tmp_path, printed, extra, bad):
    out = io.StringIO()
    assert D.check(_registry(tmp_path, printed, **extra), workdir=tmp_path, out=out) == bad
    assert ("DIFFERS  answer: doc 1.25, now " + printed in out.getvalue()) == bool(bad)


def test_check_skips_what_it_cannot_run(tmp_path):
    out = io.StringIO()
    figs = _registry(tmp_path, "1.25", skip="needs a CUDA GPU")
    figs += _registry(tmp_path, "9", speed=True, rel=0.1)
    assert D.check(figs, speed=False, workdir=tmp_path, out=out) == 0
    assert out.getvalue().count("skipped") == 2 and "needs a CUDA GPU" in out.getvalue()


def test_a_lost_locator_is_an_error(tmp_path):
    figs = _registry(tmp_path, "1.25")
    (tmp_path / "doc.md").write_text("The answer moved.\n")
    with pytest.raises(ValueError, match="locator matches 0 times"):
        D.load(tmp_path / "figures.toml")
    assert figs


def test_quick_deterministic_figures_reproduce(tmp_path):
    figs = [f for f in D.load() if f.quick and not f.speed and not f.skip
            and f.command.startswith(CI_COMMANDS)]
    assert len(figs) > 30
    out = io.StringIO()
    bad = D.check(figs, workdir=tmp_path, out=out)
    assert bad == 0, out.getvalue()
