"""emu.fold_sum: the float32 sum in a defined order (docs/semantics.md §6)."""
import numpy as np
import pytest

import emu
from conftest import assert_bits_equal
from emu import sizes


def reference(x, axis, keepdims=False):
    """The definition, one float32 add at a time: reduced axes moved last in order, each
    result the left fold of its elements in C order, from the first; empty: +0."""
    x = np.asarray(x, np.float32)
    nd = x.ndim
    axes = tuple(range(nd)) if axis is None else \
        tuple(sorted(a % nd for a in ((axis,) if isinstance(axis, int) else axis)))
    kept = [d for d in range(nd) if d not in axes]
    y = np.transpose(x, kept + list(axes)).reshape(
        [x.shape[d] for d in kept] + [int(np.prod([x.shape[d] for d in axes]))])
    out = np.zeros(y.shape[:-1], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for idx in np.ndindex(*y.shape[:-1]):
            row = y[idx]
            if row.size:
                acc = row[0]
                for v in row[1:]:
                    acc = np.float32(acc + v)
                out[idx] = np.float32(np.nan) if np.isnan(acc) else acc
    if keepdims:
        out = out.reshape([1 if d in axes else x.shape[d] for d in range(nd)])
    return out


@pytest.fixture
def data(rng):
    x = (rng.standard_normal((3, 4, 5, 6)) * np.exp2(rng.integers(-30, 30, (3, 4, 5, 6)))
         ).astype(np.float32)
    x[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]
    x[1, 1, 1, :] = -0.0
    x[2, 2, 2, :2] = 3e38                        # overflow to inf in the fold
    x[0, 3, 4, :] = [1e-45, -1e-45, 2e-45, 1e-40, -0.0, 0.0]
    return x


@pytest.mark.parametrize("axis", [-1, 0, 1, (1, 2), (0, 2), (0, 3), (2, 3), (0, 1, 2, 3), None])
@pytest.mark.parametrize("keepdims", [False, True])
def test_fold_sum_is_the_left_fold(data, axis, keepdims):
    got = emu.fold_sum(data, axis, keepdims)
    assert_bits_equal(got, reference(data, axis, keepdims), what=f"axis={axis}")
    assert np.shape(got) == np.zeros_like(data).sum(axis=axis, keepdims=keepdims).shape


def test_fold_sum_order_is_not_numpys(rng):
    """A sum whose association matters: the fold gives the left fold's bits."""
    x = np.float32([1e8, 1, -1e8, 1] * 64)
    assert emu.fold_sum(x) == reference(x, None) == np.float32(1.0)
    assert_bits_equal(emu.fold_sum(np.float32([-0.0, -0.0])), np.float32(-0.0))
    assert_bits_equal(emu.fold_sum(np.float32([-0.0])), np.float32(-0.0))
    assert emu.fold_sum(np.zeros((2, 0), np.float32), -1).tolist() == [0.0, 0.0]
    assert isinstance(emu.fold_sum(x), np.float32)
    nan = emu.fold_sum(np.array([1.0, np.uint32(0xFFC00001).view(np.float32)], np.float32))
    assert np.float32(nan).view(np.uint32) == 0x7FC00000


def test_fold_sum_serial_and_parallel_agree(rng):
    """Above emu._kernels.SERIAL elements the parallel twins run: the same fold."""
    x = (rng.standard_normal((sizes.SERIAL // 64 + 3, 70)) * 1e3).astype(np.float32)
    for axis in (-1, 0):
        assert_bits_equal(emu.fold_sum(x, axis), reference(x, axis), what=f"axis={axis}")


def test_fold_sum_bad_axes():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="out of range"):
        emu.fold_sum(x, 2)
    with pytest.raises(ValueError, match="repeats"):
        emu.fold_sum(x, (1, -1))
    with pytest.raises(TypeError, match="axis must be"):
        emu.fold_sum(x, 1.0)
    with pytest.raises(TypeError, match="floating"):
        emu.fold_sum(np.array(["a"]))
