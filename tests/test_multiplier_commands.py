"""Issue 23 on the command line: pamsim train --mul a,b,c (one table, one figure), the
multipliers study end to end on a tiny configuration, and --mul on ablate, study and bench."""
import json
import math

import pytest

import emu
from sim import bench
from sim.benches import multipliers as BM
from sim.cli import main

TINY = ["--epochs", "1", "--max-steps", "4", "--quiet"]


def test_train_several_multipliers(tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["train", "--mul", "exact,pam,lmul", "--ops", "matmul", *TINY, "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for name in ("float32 ", "exact ", "PAM ", "L-Mul ", "max |err|", "MAC pJ"):
        assert name in text, name
    stem = "train_digits_mlp_bfloat16_epochs-1_max-steps-4_ops-matmul_mul-exact+pam+lmul"
    data = json.loads((out / f"{stem}.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["float32", "exact", "PAM", "L-Mul"]
    assert all(r["steps"] == 4 for r in data["runs"])
    facts = {f["mul"]: f for f in data["multipliers"]}
    assert list(facts) == ["float32 (native)", "exact", "pam", "lmul"]
    assert all(math.isfinite(f[k]) for f in facts.values()
               for k in ("mean_err", "max_err", "mac_pj", "energy_ratio", "area_ratio"))
    assert facts["exact"]["energy_ratio"] == 1.0 and facts["pam"]["energy_ratio"] < 1
    assert facts["pam"]["max_err"] == pytest.approx(1 / 9)
    assert facts["pam"]["mac_pj"] == facts["lmul"]["mac_pj"]
    assert (out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    # one value: today's table and output names; the baseline comes from the cache
    assert main(["train", "--mul", "lmul", "--ops", "matmul", *TINY, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "float32 baseline reused" in text and "config" in text.splitlines()[1]
    one = json.loads((out / "train_digits_mlp_bfloat16_epochs-1_max-steps-4_ops-matmul_"
                             "mul-lmul.json").read_text())
    assert [r["name"] for r in one["runs"]] == ["float32", "PAM"] and "multipliers" not in one


def test_train_refused_multiplier_is_one_line(capsys):
    assert main(["train", "--mul", "pam,cpam3-unbiased", "--fmt", "e5m2", "--ops", "matmul",
                 *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pamsim train: error: ") and "indexes 3 mantissa bits" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        main(["train", "--mul", "pam,pam"])
    assert exc.value.code == 2 and "distinct" in capsys.readouterr().err


def test_study_multipliers_end_to_end(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", "multipliers", "--quick", "--setups", "vision", "--seeds", "2",
                 "--formats", "bf16", "--groups", "matmul/all", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads((out / "multipliers_vision_seeds-2_formats-bfloat16_quick.json")
                      .read_text())
    setups = data["vision"]["setups"]
    rows = setups["bfloat16 operands, ops=matmul"]["rows"]
    assert list(rows) == ["float32 (native)", "exact", "PAM", "L-Mul", "cpam2-unbiased"]
    for name, st in rows.items():
        assert len(st["values"]) == 2 and math.isfinite(st["mean"])
        assert all(math.isfinite(st[k]) for k in ("mac_pj", "energy_ratio", "area_ratio",
                                                  "mean_err", "max_err"))
        if name != "float32 (native)":
            assert 0 <= st["p"] <= 1, (name, st["p"])
    assert rows["exact"]["energy_ratio"] == 1.0
    assert rows["PAM"]["energy_ratio"] < rows["cpam2-unbiased"]["energy_ratio"] < 1
    # every multiply: each multiplier PAMConfig takes there runs; cpam2-unbiased has no
    # table for the float32 of pa_fmt, which is one line, the other rows still run
    every = setups["bfloat16 operands, ops=all"]
    assert list(every["rows"]) == list(rows)[:-1]
    assert list(every["not_runnable"]) == ["cpam2-unbiased"]
    assert ("set-up vision, bfloat16 operands, ops=all, cpam2-unbiased: not runnable: "
            "pa_fmt=float32") in text
    md = (out / "multipliers_vision_seeds-2_formats-bfloat16_quick.md").read_text()
    assert "| cpam2-unbiased |" in md and "Welch" in md
    assert (out / "multipliers_vision_seeds-2_formats-bfloat16_quick.png").exists()


def test_study_multipliers_unfit_format_is_reported(tmp_path, capsys):
    # no shipped cpam2 table for float32's 23 mantissa bits: that set-up is one line
    assert main(["study", "multipliers", "--quick", "--setups", "vision", "--seeds", "2",
                 "--formats", "float32", "--groups", "matmul", "--muls", "cpam2-unbiased",
                 "--quiet", "--out", str(tmp_path)]) == 0
    assert "float32 operands, ops=matmul, cpam2-unbiased: not runnable: fmt=float32: " \
        "cpam2-unbiased: tables are shipped" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["study", "multipliers", "--mul", "lmul"], "--mul lmul is for table3 and table6"),
    (["study", "table6", "--mul", "cpam3-unbiased", "--mantissa", "2"], "indexes 3 mantissa"),
    (["study", "table3", "--mul", "cpam2-unbiased"], "cpam2-unbiased"),
    (["ablate", "--mul", "cpam3-unbiased", "--fmt", "e8m2"], "cpam3-unbiased"),
    (["bench", "--only", "emu", "--mul", "lmul"], "--mul times the multipliers group"),
])
def test_mul_refused_before_work(argv, msg, capsys, monkeypatch):
    def work(*a, **k):
        raise AssertionError("the work started")
    monkeypatch.setattr("sim.train.train", work)
    monkeypatch.setattr("sim.bench.run", work)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_bench_mul_limits_the_multiplier_rows(capsys):
    assert main(["bench", "--quick", "--only", "multipliers", "--mul", "lmul,cpam3-unbiased"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("matmul ")]
    assert [r.split()[3] for r in rows] == ["mul=lmul,", "mul=cpam3-unbiased,",
                                            "mul=lmul,", "mul=cpam3-unbiased,"]
    assert all("same, mul=pam" in r for r in rows)
    assert "<= 1.1x" in rows[0] and "<=" not in rows[1]


def test_bench_plan_and_targets():
    own = BM.plan()
    assert (("bfloat16", emu.multiplier("lmul")) in own
            and ("float8_e4m3fn", emu.multiplier("lmul")) not in own)
    assert BM.plan(["cpam4-unbiased"]) == [("bfloat16", emu.multiplier("cpam4-unbiased"))]
    assert [BM.target(m) for m in ("pam+3", "lmul", "cpam2-minimax", "cpam3-unbiased", "exact",
                                   "float", "pam")] == [1.1, 1.1, 2.0, None, 1.5, 1.5, None]
    with pytest.raises(ValueError, match=r"mul=\['lmul'\] is taken by the group\(s\) \['multipliers'\]"):
        bench.run(quick=True, only=["emu"], mul=["lmul"])
