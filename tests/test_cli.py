"""The pamsim command line: error report, Figure 2, bench (quick), argument errors."""
import json
import math
import subprocess
import sys
import warnings

import pytest

import emu
from sim import bench
from sim.cli import main


def test_error_report_and_figure(tmp_path, capsys):
    png = tmp_path / "fig2.png"
    js = tmp_path / "err.json"
    assert main(["error", "--fmt", "e8m4", "--png", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "e8m4" in out and "-11.1111%" in out
    assert png.stat().st_size > 20_000 and png.read_bytes()[:4] == b"\x89PNG"
    rows = {r["op"]: r for r in json.loads(js.read_text())}
    assert set(rows) == {"pam_mul", "pa_div", "pa_exp2", "pa_exp", "pa_log2", "pa_log", "pa_sqrt"}
    assert rows["pam_mul"]["min"] == pytest.approx(-1 / 9, abs=1e-12)
    assert rows["pam_mul"]["max"] == 0.0
    assert rows["pa_div"]["max"] == pytest.approx(0.125, abs=1e-12)      # 1 ÷̂ 1.5 = 0.75


@pytest.mark.parametrize("fmt", ["e4m3fnuz", "e3m4", "e4m3fn"])
def test_error_report_is_defined_on_narrow_formats(fmt, tmp_path, capsys):
    """Issue 30: no nan, inf or numpy warning; what lies outside the format's normal
    range (flushed or overflowed: range, not approximation error) is counted and said."""
    js = tmp_path / "err.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["error", "--fmt", fmt, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    rows = {r["op"]: r for r in json.loads(js.read_text())}
    stats = ("min", "max", "mean", "mean_abs", "rms")
    assert all(math.isfinite(r[k]) and r["count"] for r in rows.values() for k in stats)
    assert "normal range" in out and "read subnormals as zero" in out
    assert rows["pa_log2"]["left_out"]["operand"] > 0
    assert -1 < rows["pa_log2"]["min"] < 0      # e4m3fn's -441.8 was log2(subnormal) = -max


def test_error_report_of_multipliers(tmp_path, capsys):
    png, js = tmp_path / "lmul.png", tmp_path / "mul.json"
    assert main(["error", "--fmt", "e4m3fn", "--mul", "all", "lmul+1", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "every pair of normal mantissas (64 pairs)" in out and "cpam2-unbiased" in out
    rows = {r["mul"]: r for r in json.loads(js.read_text())}
    assert set(rows) == {*emu.MULTIPLIERS, "lmul+1"} - {"cpam4-unbiased", "cpam4-minimax"}
    assert rows["pam"]["min"] == pytest.approx(-1 / 9, abs=1e-12) and rows["pam"]["max"] == 0
    assert main(["error", "--fmt", "bf16", "--mul", "lmul", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bare_pamsim_runs_the_main_job(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sim.cli"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # the main job: the digits MLP with native float32, the exact product, PAM and L-Mul at
    # bf16, one table (error statistics, cost per MAC) and one figure
    assert "pamsim train: mlp on digits" in proc.stdout
    assert "bfloat16 all-ops approx (exact: loss) mul=exact" in proc.stdout
    assert "MAC pJ" in proc.stdout
    out = tmp_path / "out" / "train"
    stem = "train_digits_mlp_bfloat16_mul-exact+pam+lmul"
    js = json.loads((out / f"{stem}.json").read_text())
    assert [r["name"] for r in js["runs"]] == ["float32", "exact", "PAM", "L-Mul"]
    assert [r["evals"][-1]["acc"] > 0.9 for r in js["runs"]] == [True] * 4
    assert [f["mul"] for f in js["multipliers"]] == ["float32 (native)", "exact", "pam", "lmul"]
    assert (out / f"{stem}.png").exists()


def test_bench_quick(capsys, tmp_path):
    js = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "emu", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    rows = json.loads(js.read_text())
    names = [r["name"] for r in rows]
    assert any("1 thread" in n for n in names) and any("pam_mul" in n for n in names)
    assert all(r["seconds"] > 0 and r["baseline_seconds"] > 0 and r["ratio"] > 0 for r in rows)
    assert "ratio" in out and "torch.matmul fp32" in out
    assert out.startswith("host: ") and "lanes" in out.splitlines()[0]


def test_bench_unknown_group(capsys):
    assert main(["bench", "--only", "nosuch"]) == 2
    assert "unknown bench case group" in capsys.readouterr().err


def test_bench_rows_format():
    rows = [bench.Row("a", 0.002, "b", 0.001, target=3.0), bench.Row("c", 0.004, "d", 0.001, 3.0)]
    text = bench.format_rows(rows)
    assert "2.00x" in text and "ok" in text and "MISSED" in text


@pytest.mark.parametrize("argv,msg", [(["error", "--fmt", "bf17"], "fmt='bf17' is not a format"),
                                      (["nosuch"], "invalid choice")])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_bench_device_cuda_without_gpu(capsys):
    """Without a GPU the CUDA group says so and the command still succeeds."""
    assert main(["bench", "--device", "cuda", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "(no rows)" in out


def test_a_command_whose_extra_is_missing_is_one_line(capsys, monkeypatch):
    """On a machine without an optional extra (the GPU machines have no amaranth) the
    other commands still run, and that one says why in one line, exit 2."""
    import costs.units
    from sim import cli

    def missing():
        raise RuntimeError("the rtl package is needed to build units: install pamsim's "
                           "rtl extra (amaranth)")
    monkeypatch.setattr(costs.units, "catalog", missing)
    assert cli.main(["fpga", "--unit", "mac", "--sweep"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pamsim fpga: error: the rtl package is needed to build units: install "
                   "pamsim's rtl extra (amaranth)"]
    assert "unavailable here" in cli.build_parser().format_help()


def test_version_from_a_checkout(monkeypatch):
    import importlib.metadata as md

    from sim import cli

    def not_installed(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "version", not_installed)
    assert cli._version().endswith("(source checkout)")
