"""Shared test helpers: bit-exact comparison (NaNs by class), format value sets, and
running a test file under Numba's CUDA simulator."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import emu

FP8 = ["float8_e5m2", "float8_e4m3fn", "e4m3"]     # e4m3: the IEEE-style twin of e4m3fn
#: the other encoding policies, exhaustive in tests/test_ops.py: fnuz (an 8-bit one and a
#: 6-bit one with a non-default bias) and the saturating MX element types in CI; the
#: remaining catalog formats of 8 bits (same policies, other E/M/bias) marked slow
#: P3109 (fnuz with inf) in 6 bits: M = 0 with an even bias (ties to the even exponent)
#: and M = 2 (binary8 P1 and P4 passed the same tests once, 2026-11-27: 44 s; CI time)
POLICIES = ["float8_e4m3fnuz", "e3m2b5fnuz", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn",
            "p3109_k6p1se", "p3109_k6p3se",
            *(pytest.param(f, marks=pytest.mark.slow)
              for f in ("float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4"))]


def same_bits(actual, expected) -> np.ndarray:
    """Elementwise: identical float32 bit patterns, or both NaN."""
    a = np.asarray(actual, np.float32)
    e = np.asarray(expected, np.float32)
    a, e = np.broadcast_arrays(a, e)
    return (a.view(np.uint32) == e.view(np.uint32)) | (np.isnan(a) & np.isnan(e))


def assert_bits_equal(actual, expected, *inputs, what=""):
    """Assert bit equality; on failure list the first mismatches with their inputs."""
    ok = same_bits(actual, expected)
    if ok.all():
        return
    a = np.broadcast_to(np.asarray(actual, np.float32), ok.shape)
    e = np.broadcast_to(np.asarray(expected, np.float32), ok.shape)
    bad = np.argwhere(~ok)[:8]
    rows = []
    for idx in map(tuple, bad):
        ins = [np.broadcast_to(np.asarray(x, np.float32), ok.shape)[idx] for x in inputs]
        rows.append(f"  inputs={[f'{v!r} ({np.float32(v).view(np.uint32):#010x})' for v in ins]} "
                    f"got {a[idx]!r} ({a[idx].view(np.uint32):#010x}) "
                    f"want {e[idx]!r} ({e[idx].view(np.uint32):#010x})")
    pytest.fail(f"{what}: {int((~ok).sum())} of {ok.size} differ\n" + "\n".join(rows))


def forward_backward(f, x, grad=None):
    """(f(x), the gradient of x) for the upstream gradient ``grad`` (default ones), on a
    copy of ``x`` that requires grad."""
    xr = x.clone().requires_grad_(True)
    y = f(xr)
    y.backward(y.new_ones(y.shape) if grad is None else grad)
    return y.detach(), xr.grad


def all_values(fmt) -> np.ndarray:
    """Every encoding of a format (<= 16 bits wide) decoded to float32, NaNs included."""
    fmt = emu.format(fmt)
    assert fmt.width <= 16
    return emu.from_bits(np.arange(1 << fmt.width, dtype=np.uint32), fmt)


def corner_values(fmt) -> np.ndarray:
    """Special classes and exponent boundaries of a format, both signs."""
    fmt = emu.format(fmt)
    sub = fmt.smallest_subnormal
    tiny = fmt.smallest_normal
    v = [0.0, sub, 2 * sub, tiny - sub, tiny, tiny * (1 + fmt.eps), 0.5, 1.0,
         1 + fmt.eps, 1.5, 2 - fmt.eps, 2.0, 3.0, fmt.max / 2, fmt.max * (1 - fmt.eps / 2),
         fmt.max, float("nan")]
    if fmt.has_inf:
        v.append(float("inf"))
    v = np.array(v, np.float64)
    v = emu.quantize(v.astype(np.float32), fmt)
    return np.unique(np.concatenate([v, -v]).view(np.uint32)).view(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


def spy(monkeypatch, module, name):
    """The results of every call of ``module.<name>`` from here on."""
    seen, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args: seen.append(real(*args)) or seen[-1])
    return seen


def run_in_simulator(test_file, **env):
    """Run ``test_file`` in a subprocess under Numba's CUDA simulator (it must be on
    before ``numba.cuda`` is imported); every test in it must pass, none be skipped."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist"],
        cwd=Path(__file__).parent.parent, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1", **env),
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]


# The longest single tests (the CUDA simulator's subprocesses, the docs' quick figures),
# longest first, run before the rest: xdist then hands the short ones to whichever worker
# is free, instead of leaving one worker with a long test at the end (CI time).
SLOW_FIRST = ("test_memory_cuda_matches_cpu", "test_cuda_simulator[exhaustive]",
              "test_quick_deterministic_figures_reproduce", "test_torch_cuda_backend_matches_cpu",
              "test_cuda_simulator[elementwise]", "test_cuda_simulator[matmul]")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.name, len(rank)))
