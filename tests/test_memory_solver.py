"""The optimal piecewise-constant derivative solver (Few-Bit Backward, eqs. 3-9) and
its stored tables: DP against brute force, eq. 5 against finite differences, the
paper's Table 1, regeneration of stored tables, bad arguments."""
import itertools

import numpy as np
import pytest
import torch

from torch_bridge.memory import ACTIVATIONS, activation, fewbit_table, solve, table_error
from torch_bridge.memory import solver as S
from torch_bridge.memory import tables

PAPER = {"gelu": (0.1410, 0.0406, 0.0119, 0.0031), "silu": (0.2150, 0.0479, 0.0170, 0.0045),
         "sigmoid": (0.0181, 0.0038, 0.0009, 0.0002), "tanh": (0.1584, 0.0319, 0.0073, 0.0017),
         "selu": (0.2554, 0.1010, 0.0184, 0.0039), "softplus": (0.2902, 0.0541, 0.0121, 0.0029)}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_table1(name):
    """The stored uniform-weight tables reproduce Table 1 to its 4 printed digits."""
    for b, paper in enumerate(PAPER[name], start=1):
        assert fewbit_table(name, b).error == pytest.approx(paper, abs=1e-4)
    assert fewbit_table("relu", 1).error == 0.0


def test_dp_equals_brute_force():
    """Eq. 7 on a tiny grid: the DP optimum is the minimum over every set of cuts."""
    prob = S._Problem(activation("gelu"), "normal", 4.0, 20, even=False)
    best, arg = S._dp(prob.W, prob.FW, prob.F2, 4)
    n = len(prob.grid) - 1
    cost = S._cost.py_func
    for k in (2, 3, 4):
        brute = min(sum(cost(prob.W, prob.FW, prob.F2, a, b) for a, b in zip((0, *cuts), (*cuts, n)))
                    for cuts in itertools.combinations(range(1, n), k - 1))
        assert best[k] == pytest.approx(brute, rel=1e-12)
        cuts = S._backtrack(arg, n, k)
        assert sum(cost(prob.W, prob.FW, prob.F2, a, b)
                   for a, b in zip((0, *cuts), (*cuts, n))) == pytest.approx(brute, rel=1e-12)


def test_interval_cost_is_the_weighted_variance():
    """T(j, i) of eq. 9 from prefix sums == ∫(f' − mean)² w over the interval."""
    prob = S._Problem(activation("silu"), "normal", 10.0, 64, even=False)
    j, i = 20, 41
    x = np.linspace(prob.grid[j], prob.grid[i], 200_001)
    d, w = prob.fprime(x), prob.w(x)
    from scipy.integrate import simpson
    mean = simpson(d * w, x=x) / simpson(w, x=x)
    direct = simpson((d - mean) ** 2 * w, x=x)
    assert S._cost(prob.W, prob.FW, prob.F2, j, i) == pytest.approx(direct, rel=1e-8)


@pytest.mark.parametrize("name,weight,even", [("gelu", "uniform", False), ("mish", "normal", False),
                                               ("tanh", "normal", True)])
def test_gradient_and_hessian_match_finite_differences(name, weight, even):
    prob = S._Problem(activation(name), weight, 10.0, 256, even)
    s = np.sort(np.random.default_rng(1).uniform(prob.lo + 0.3, 3.0, 6))
    L, _, g, diag, off = prob.loss(s, hessian=True)
    h = 1e-6
    eye = np.eye(len(s)) * h
    g_fd = np.array([(prob.loss(s + e)[0] - prob.loss(s - e)[0]) / (2 * h) for e in eye])
    H_fd = np.stack([(prob.loss(s + e)[2] - prob.loss(s - e)[2]) / (2 * h) for e in eye], 1)
    np.testing.assert_allclose(g, g_fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(diag, np.diag(H_fd), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(off, np.diag(H_fd, 1), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", ["gelu", "selu", "sigmoid"])
def test_refinement_reaches_a_stationary_point(name):
    """After refinement L <= the grid optimum and eq. 5 vanishes where f' is smooth:
    f'(s_i) = (y_i + y_{i-1}) / 2 (each breakpoint halfway between its levels)."""
    t = fewbit_table(name, 4, "normal")
    assert t.error <= t.dp_error
    prob = S._Problem(activation(name), "normal", 10.0, 64, t.even)
    _, y, g = prob.loss(np.array(t.breakpoints))
    smooth = np.abs(np.array(t.breakpoints)) > 1e-9         # SELU's kink at 0
    assert np.abs(g[smooth]).max() < 1e-9
    d = prob.fprime(np.array(t.breakpoints))
    np.testing.assert_allclose(d[smooth], ((y[1:] + y[:-1]) / 2)[smooth], atol=1e-7)


@pytest.mark.parametrize("name,weight,bits", [("gelu", "uniform", 3), ("tanh", "uniform", 2),
                                              ("mish", "normal", 5), ("elu", "normal", 1)])
def test_stored_error_matches_independent_quadrature(name, weight, bits):
    t = fewbit_table(name, bits, weight)
    assert table_error(t, name, weight) == pytest.approx(t.error, rel=1e-6, abs=1e-12)


def test_stored_tables_are_complete_and_converge():
    stored = tables.stored_fewbit()
    for name in tables.FEWBIT_ACTIVATIONS:
        for weight in S.WEIGHTS:
            errs = [stored[(name, weight, b)].error for b in range(1, 9)]
            assert all(a > b for a, b in zip(errs, errs[1:])), (name, weight, errs)
            assert 1.5 < errs[3] / errs[4] < 6        # the paper: 2-4x per extra bit
            t = stored[(name, weight, 8)]
            assert len(t.breakpoints) == 255 and len(t.values) == 256
            assert np.all(np.diff(t.breakpoints) > 0)


def test_regenerated_tables_equal_the_stored_ones():
    """`pamsim fewbit-tables` is deterministic and host-independent: re-solving
    reproduces the data file bit for bit on any CPU, thread count or torch/numpy code
    path (the solver's arithmetic is scalar libm, IEEE operations and fixed-order
    sums: solver module docstring)."""
    stored = tables.stored_fewbit()
    doc = tables.generate_fewbit(["gelu", "sigmoid", "selu"], bits=[1, 2, 3])
    assert doc["version"] == tables.VERSION and doc["solver"]["cells"] == tables.SOLVER["cells"]
    for t in doc["tables"]:
        ref = stored[(t["activation"], t["weight"], t["bits"])]
        assert (tuple(t["breakpoints"]), tuple(t["values"]), t["error"], t["dp_error"]) == \
            (ref.breakpoints, ref.values, ref.error, ref.dp_error), (t["activation"], t["weight"], t["bits"])


def test_even_derivatives_quantise_the_magnitude():
    """sigmoid/tanh: the table lives on |x|, q is even, and the same bits give a smaller
    error than quantising x itself (the paper's doubled budget)."""
    t = fewbit_table("sigmoid", 2)
    assert t.even and len(t.values) == 4 and min(t.breakpoints) > 0
    x = np.linspace(-9, 9, 1001)
    np.testing.assert_array_equal(t(x), t(-x))
    plain = solve("sigmoid", 2, even=False, cells=1024)[2]
    assert not plain.even and t.error < plain.error / 3


def test_exact_step_derivatives():
    for name, left in [("relu", 0.0), ("leaky_relu", 0.01)]:
        for bits in (1, 5):
            t = fewbit_table(name, bits)
            assert t.bits == 1 and t.breakpoints == (0.0,) and t.values == (left, 1.0)
    assert fewbit_table(activation("leaky_relu", negative_slope=0.2), 3).values == (0.2, 1.0)


def test_non_default_parameters_are_solved_on_demand():
    t = fewbit_table(activation("elu", alpha=0.5), 2)
    assert t.activation == "elu(alpha=0.5)"
    assert t.error == pytest.approx(table_error(t, activation("elu", alpha=0.5)), rel=1e-6)
    assert t.values != fewbit_table("elu", 2).values


def test_definitions_match_torch_autograd():
    """The float64 definitions f, f', f'' used by the solver are the native forward and
    its first two autograd derivatives.  Both sides are float64 to a few ulp: the
    definitions by libm (< 1 ulp per call), torch by its kernels on whatever code path
    this CPU selects (Sleef's 1-ulp functions on AVX2/AVX-512, libm on the default
    path); |f|, |f'|, |f''| < 10 on [-9, 9], so a few ulp is < 1e-14, and 1e-12 holds
    on every path with a 100x margin (measured: <= 5e-15)."""
    x = torch.linspace(-9, 9, 3001, dtype=torch.float64).requires_grad_(True)
    for name in ACTIVATIONS:
        a = activation(name)
        (g,) = torch.autograd.grad(a.native(x).sum(), x, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
        xd = x.detach()
        torch.testing.assert_close(a.f(xd), a.native(xd), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a.fprime(xd), g.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a.fsecond(xd), torch.zeros_like(xd) if h is None else h,
                                   rtol=1e-12, atol=1e-12)
    # arrays in, arrays out; NaN propagates through f
    assert np.isnan(activation("gelu").f(np.array([np.nan]))).all()


@pytest.mark.parametrize("kwargs,msg", [
    (dict(bits=0), "bits=0 must be an integer in 1..8"),
    (dict(bits=9), "bits=9 must be an integer in 1..8"),
    (dict(bits=2.0), "bits=2.0 must be an integer"),
    (dict(bits=True), "bits=True must be an integer"),
    (dict(bits=2, weight="cauchy"), "weight='cauchy'; expected one of"),
    (dict(bits=2, cells=3), "cells=3 must be an integer >= 16"),
])
def test_bad_solver_arguments(kwargs, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        solve("gelu", **kwargs)


def test_bad_activation_names_and_parameters():
    with pytest.raises(ValueError, match="activation='swishy' is not supported; expected one of"):
        activation("swishy")
    with pytest.raises(ValueError, match="has no parameter 'alpha'"):
        activation("gelu", alpha=1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        activation("softplus", beta=-1.0)
    with pytest.raises(ValueError, match="even=True needs an even derivative"):
        solve("gelu", 1, even=True)
    assert activation("Swish") is activation("silu")
