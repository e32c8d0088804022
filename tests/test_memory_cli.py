"""The memory commands (`pamsim fewbit-tables`, `memory-errors`, `memory-study`) and
the `memory` bench group, at small sizes."""
import re

import pytest

from sim.cli import main


def test_fewbit_tables_report_reproduces_the_papers_table1(capsys):
    assert main(["fewbit-tables", "--report", "--activations", "gelu", "silu", "selu"]) == 0
    out = capsys.readouterr().out
    gelu = re.search(r"^gelu +(.*)$", out, re.M).group(1)
    cells = re.findall(r"([0-9.]+) \[([0-9.]+)\]", gelu)
    assert len(cells) == 4
    for ours, paper in cells:
        assert abs(float(ours) - float(paper)) <= 6e-5       # the paper prints 4 digits
    assert "PA activations" in out and re.search(r"^gelu +32 +5 ", out, re.M)


def test_fewbit_tables_check_and_bad_names(capsys):
    assert main(["fewbit-tables", "--check", "--only", "fewbit", "--activations", "sigmoid"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 6 and "MISMATCH" not in out
    assert main(["fewbit-tables", "--report", "--activations", "gleu"]) == 2
    assert "activation='gleu' is not supported" in capsys.readouterr().err


def test_memory_errors_small(capsys, tmp_path):
    png = tmp_path / "fig5.png"
    assert main(["memory-errors", "--activations", "gelu", "--points", "20001",
                 "--png", str(png)]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^  (few-bit \d|InvAct \w+) .*? ([0-9.e+-]+) +[0-9.e+-]+$", out, re.M))
    l2 = [float(rows[f"few-bit {b}"]) for b in range(1, 9)]
    assert all(a > b for a, b in zip(l2, l2[1:]))
    assert float(rows["InvAct fp32"]) < 1e-3 * l2[-1]        # InvAct beats 8-bit few-bit
    assert png.stat().st_size > 10_000


def test_memory_study_runs(capsys, tmp_path):
    png = tmp_path / "study.png"
    assert main(["memory-study", "--seeds", "1", "--epochs", "2", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    for label in ("native", "few-bit 1", "few-bit 4", "InvAct", "PA 16"):
        assert re.search(rf"^  {label} +[0-9.]+ ± ", out, re.M), label
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv,msg", [
    (["memory-study", "--seeds", "0"], "argument --seeds: got '0'; expected an integer in [1, 100]"),
    (["memory-errors", "--activations", "relu"], "invalid choice: 'relu'")])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert msg in capsys.readouterr().err


def test_bench_memory_group_quick(capsys):
    assert main(["bench", "--quick", "--only", "memory"]) == 0
    out = capsys.readouterr().out
    for name in ("FewBitGELU(bits=3)", "InvGELU", "InvSiLU", "PAGELU(pieces=16)"):
        assert re.search(rf"{re.escape(name)} fwd\+bwd, 1 M fp32.* [0-9.]+x", out), name
