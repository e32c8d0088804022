"""Test vectors for the RTL units, as format encodings (uint32, low ``width`` bits).

Exhaustive where small (every operand set of an 8-bit format), corner and boundary
constructions plus uniform random where large.  Every generator takes a numpy
``Generator`` so a seed reproduces a run; :func:`unit_rng` seeds a unit's vectors from
its name.  Each combinational unit's stress construction is its ``vectors`` entry in
the registry (rtl/registry.py).  Shared by the cocotb benches (sim/tb), ``pamsim
verify`` and the tests.
"""
from __future__ import annotations

import zlib

import numpy as np

import emu

__all__ = ["exhaustive", "special_encodings", "corner_operands", "random_operands",
           "unit_rng", "pam_boundary_pairs", "add_pairs", "fmul_pairs", "sqrt_operands",
           "nan_mask", "random_values", "dot_operands"]


def _f(fmt) -> emu.Format:
    return emu.format(fmt)


def _enc(sign, exp, man, fmt: emu.Format) -> np.ndarray:
    sign, exp, man = (np.asarray(x, np.int64) for x in (sign, exp, man))
    return ((sign << (fmt.width - 1)) | (exp << fmt.man_bits) | man).astype(np.uint32)


def _all_sets(codes: np.ndarray, arity: int):
    """Every ordered ``arity``-tuple of ``codes``, as ``arity`` arrays (first varies slowest)."""
    idx = np.indices((codes.size,) * arity).reshape(arity, -1)
    return tuple(codes[i] for i in idx)


def exhaustive(fmt, arity: int = 2):
    """Every operand set of ``arity`` encodings: ``2^(arity width)``, at most 2^16."""
    f = _f(fmt)
    if arity * f.width > 16:
        raise ValueError(f"exhaustive operands need arity * width <= 16, {f.name} has width "
                         f"{f.width} and arity={arity}")
    return _all_sets(np.arange(1 << f.width, dtype=np.uint32), arity)


def special_encodings(fmt) -> np.ndarray:
    """Every special class and exponent boundary of ``fmt``, both signs, several NaNs."""
    f = _f(fmt)
    M, top = f.man_bits, (1 << f.exp_bits) - 1
    full = (1 << M) - 1
    mags = [0, 1, 1 << (M - 1), full,                     # zero, subnormals
            1 << M, (1 << M) + 1, (2 << M) - 1,             # smallest normals
            f.bias << M, (f.bias << M) + 1, (f.bias << M) | (1 << (M - 1)),   # 1, 1+ulp, 1.5
            ((f.bias + 1) << M) - 1,                         # 2 - ulp
            f.max_encoding - (1 << M), f.max_encoding - 1, f.max_encoding]
    if f.nan_encoding is not None:                          # its magnitude (fnuz: 0)
        mags.append(f.nan_encoding & ((1 << (f.width - 1)) - 1))
    if f.has_inf:
        mags += [top << M, (top << M) | 1, (top << M) | full]   # inf, signalling and other NaNs
    mags = np.unique(np.array(mags, np.int64))
    return np.concatenate([mags, mags | (1 << (f.width - 1))]).astype(np.uint32)


def corner_operands(fmt, arity: int = 2):
    """All ordered operand sets of :func:`special_encodings`."""
    return _all_sets(special_encodings(fmt), arity)


def random_operands(rng, fmt, n: int, arity: int = 2):
    """``arity`` arrays of ``n`` uniformly random encodings (every class in its natural
    proportion)."""
    f = _f(fmt)
    return tuple(rng.integers(0, 1 << f.width, n, dtype=np.uint64).astype(np.uint32)
                 for _ in range(arity))


def unit_rng(seed: int, unit: str, stream: str) -> np.random.Generator:
    """The random generator of ``unit``'s vectors of kind ``stream``: seeded by ``seed``
    and CRC-32s of the two names, so a unit's vectors depend on its name alone (adding,
    removing or renaming another unit changes nothing; ``hash()`` of a str would
    change per process)."""
    return np.random.default_rng([int(seed), zlib.crc32(unit.encode()),
                                  zlib.crc32(stream.encode())])


def _rand_man(rng, f, n):
    return rng.integers(0, 1 << f.man_bits, n, dtype=np.int64)


def _rand_sign(rng, n):
    return rng.integers(0, 2, n, dtype=np.int64)


def pam_boundary_pairs(rng, fmt, n: int, op: str):
    """Normal operand pairs whose PA result lands within a few binades of the flush
    (smallest normal) or overflow (largest finite) boundary; random mantissas, so
    about half carry from the mantissa sum into the exponent (``op``: mul or div)."""
    f = _f(fmt)
    emax_field = f.max_encoding >> f.man_bits
    ea = rng.integers(1, emax_field + 1, n, dtype=np.int64)
    target = np.where(rng.random(n) < 0.5, 1, emax_field) + rng.integers(-2, 2, n)
    eb = (target - ea + f.bias) if op == "mul" else (ea - target + f.bias)
    eb = np.clip(eb, 1, emax_field)
    return (_enc(_rand_sign(rng, n), ea, _rand_man(rng, f, n), f),
            _enc(_rand_sign(rng, n), eb, _rand_man(rng, f, n), f))


def add_pairs(rng, fmt, n: int):
    """Adder stress: every alignment distance, massive cancellation, exact ties, sums
    of subnormals, ``x + (-x)``, and overflow near the largest finite value."""
    f = _f(fmt)
    M = f.man_bits
    emax_field = f.max_encoding >> M
    k = n // 6
    out_a, out_b = [], []
    # 1. exponent gap 0 .. M + 6 (past the sticky window), random signs and mantissas
    ea = rng.integers(1, emax_field + 1, k, dtype=np.int64)
    eb = np.clip(ea - rng.integers(0, M + 7, k), 0, emax_field)
    out_a.append(_enc(_rand_sign(rng, k), ea, _rand_man(rng, f, k), f))
    out_b.append(_enc(_rand_sign(rng, k), eb, _rand_man(rng, f, k), f))
    # 2. massive cancellation: b = -(a + small integer offset) in encoding space
    a = rng.integers(0, f.max_encoding + 1, k, dtype=np.int64)
    b = np.clip(a + rng.integers(-3, 4, k), 0, f.max_encoding)
    s = _rand_sign(rng, k)
    out_a.append(_enc(s, 0, a, f))
    out_b.append(_enc(1 - s, 0, b, f))
    # 3. ties: b is exactly half an ulp of a (or one quantum more or less), which
    # is a tie to even for a of either mantissa parity
    ea = rng.integers(M + 3, emax_field + 1, k, dtype=np.int64) if emax_field > M + 3 \
        else rng.integers(1, emax_field + 1, k, dtype=np.int64)
    eb = np.clip(ea - M - 1, 1, emax_field)
    man_b = rng.choice(np.array([0, 0, 1, (1 << M) - 1], np.int64), k)
    s = _rand_sign(rng, k)
    out_a.append(_enc(s, ea, _rand_man(rng, f, k), f))
    out_b.append(_enc(np.where(rng.random(k) < 0.7, s, 1 - s), eb, man_b, f))
    # 4. subnormal and smallest-normal operands
    out_a.append(_enc(_rand_sign(rng, k), rng.integers(0, 3, k), _rand_man(rng, f, k), f))
    out_b.append(_enc(_rand_sign(rng, k), rng.integers(0, 3, k), _rand_man(rng, f, k), f))
    # 5. x + (-x) and x + x
    a = rng.integers(0, f.max_encoding + 1, k, dtype=np.int64)
    s = _rand_sign(rng, k)
    out_a.append(_enc(s, 0, a, f))
    out_b.append(_enc(np.where(rng.random(k) < 0.8, 1 - s, s), 0, a, f))
    # 6. near overflow, same sign
    rest = n - 5 * k
    s = _rand_sign(rng, rest)
    out_a.append(_enc(s, emax_field - rng.integers(0, 2, rest), _rand_man(rng, f, rest), f))
    out_b.append(_enc(s, emax_field - rng.integers(0, M + 3, rest).clip(0, emax_field - 1),
                      _rand_man(rng, f, rest), f))
    return np.concatenate(out_a), np.concatenate(out_b)


def fmul_pairs(rng, fmt, n: int):
    """IEEE multiplier stress: products within a few binades of the flush boundary
    (including the round-up-to-smallest-normal band) and of overflow."""
    f = _f(fmt)
    emax_field = f.max_encoding >> f.man_bits
    ea = rng.integers(1, emax_field + 1, n, dtype=np.int64)
    # unbiased product exponent ea + eb - 2 bias near emin - 1 or emax
    target = np.where(rng.random(n) < 0.6, f.emin - 1, f.emax) + rng.integers(-2, 2, n)
    eb = np.clip(target - ea + 2 * f.bias, 1, emax_field)
    return (_enc(_rand_sign(rng, n), ea, _rand_man(rng, f, n), f),
            _enc(_rand_sign(rng, n), eb, _rand_man(rng, f, n), f))


def sqrt_operands(rng, fmt, n: int):
    """Square-root stress, as a 1-tuple: normal operands at both ends of the exponent
    range and around 1 (exponents of both parities, mantissas of both parities, so
    half the roots are exact ties), plus a tenth negative (NaN) operands."""
    f = _f(fmt)
    emax_field = f.max_encoding >> f.man_bits
    ends = np.concatenate([np.arange(1, 4), np.arange(f.bias - 2, f.bias + 3),
                           np.arange(emax_field - 2, emax_field + 1)])
    e = np.clip(rng.choice(ends, n), 1, emax_field)
    sign = (rng.random(n) < 0.1).astype(np.int64)
    return (_enc(sign, e, _rand_man(rng, f, n), f),)


def nan_mask(bits, fmt) -> np.ndarray:
    """Which encodings are NaN codes of the format's policy (any sign or payload), as
    ``emu.from_bits`` decodes them (docs/semantics.md §9 rule 6)."""
    return np.isnan(emu.from_bits(np.asarray(bits, np.uint32), _f(fmt)))


# --- operands of dot products (MAC, array, rtl_matmul) ------------------------------

def random_values(rng, fmt, shape, specials: float = 0.0) -> np.ndarray:
    """float32 values of ``fmt``: signed, exponents mostly within 2^±6 (products of
    either sign, so sums cancel), a share of extreme exponents (flush and overflow
    of products), and a fraction ``specials`` of ±0, subnormals, ±inf and NaN."""
    f = _f(fmt)
    n = int(np.prod(shape))
    mags = rng.uniform(1, 2, n) * np.exp2(rng.integers(-6, 7, n))
    wide = rng.random(n) < 0.05
    mags[wide] = rng.uniform(1, 2, wide.sum()) * np.exp2(
        rng.integers(f.emin, f.emax + 1, wide.sum()))
    v = np.where(rng.random(n) < 0.5, -mags, mags)
    v = emu.quantize(v.astype(np.float32), f)       # RNE into fmt (may overflow to inf)
    if specials:
        pick = rng.random(n) < specials
        pool = emu.from_bits(special_encodings(f), f)
        v[pick] = rng.choice(pool, pick.sum())
    return v.reshape(shape)


def dot_operands(rng, fmt, lengths, special_share: float = 0.3, special_rate: float = 0.03):
    """Operand pairs of dot products of the given lengths: ``special_share`` of them
    carry specials at ``special_rate`` per element; the rest are finite."""
    out = []
    for k in lengths:
        rate = special_rate if rng.random() < special_share else 0.0
        out.append((random_values(rng, fmt, k, rate), random_values(rng, fmt, k, rate)))
    return out
