"""``pamsim bench``'s cuda case group: says why it has no rows when there is no GPU."""
import sim.benches.cuda as bench_cuda
from sim import bench


def test_cuda_group_is_registered():
    assert "cuda" in bench.load_cases()


def test_reason_matches_numba():
    from numba import config, cuda
    usable = cuda.is_available() and not config.ENABLE_CUDASIM
    reason = bench_cuda.no_device_reason()
    assert (reason is None) == usable
    if not usable:
        assert reason.strip()


def test_without_a_device_no_rows_and_one_line(monkeypatch, capsys):
    monkeypatch.setattr(bench_cuda, "no_device_reason", lambda: "CUDA driver library cannot be found.")
    assert bench_cuda.cuda_cases(quick=True) == []
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["no CUDA device: CUDA driver library cannot be found "
                   "(the cuda case group has no rows)"]


def test_gpu_bits_smoke(tmp_path):
    """sim.gpu_bits (the bits at scale that make gpu-check runs on a device) under the
    simulator: a few operands of two formats, one of them a scale type most ops refuse."""
    import json
    import os
    import subprocess
    import sys
    proc = subprocess.run(
        [sys.executable, "-m", "sim.gpu_bits", "--out", str(tmp_path), "--parts", "random",
         "--chunk", "60", "--per-format", "60", "--formats", "float16,float8_e8m0fnu"],
        env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "bits.jsonl").read_text().splitlines()]
    assert {r["status"] for r in recs} == {"ok", "refused"}
    assert sum(r["n"] for r in recs if r["fmt"] == "float16" and r["status"] == "ok") >= 29 * 60
    assert "0 with mismatches or errors" in proc.stdout


def test_emu_acc_reruns_as_an_avx2_host(monkeypatch):
    """On an AVX-512 host the narrow-accumulator rows run once more in a process whose
    kernels are compiled as an AVX2-only host compiles them (8 lanes, haswell, no
    vrangeps), with their own Numba cache; its rows come back labelled."""
    import json
    import subprocess

    import sim.benches.emu_acc as ea
    seen = {}

    def fake_run(argv, env, **kw):
        seen.update(env=env, argv=argv)
        row = {"name": "pam_matmul bf16 256^3, acc fp16, 2 threads" + ea.AVX2, "seconds": 2.0,
               "baseline": "same, acc float32", "baseline_seconds": 1.0, "target": 3.0}
        return subprocess.CompletedProcess(argv, 0, json.dumps([row]) + "\n", "")
    monkeypatch.setattr(ea.subprocess, "run", fake_run)
    rows = ea.avx2_rows(quick=True)
    assert seen["env"]["PAMSIM_VECTOR_LANES"] == "8"
    assert seen["env"]["NUMBA_CPU_NAME"] == "haswell"
    assert seen["env"]["NUMBA_CACHE_DIR"].endswith("numba-avx2")
    assert seen["argv"][-1] == "1" and "narrow_rows" in seen["argv"][-2]
    assert [(r.name.endswith(ea.AVX2), r.ratio, r.target) for r in rows] == [(True, 2.0, 3.0)]
