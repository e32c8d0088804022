"""Multipliers as data (docs/semantics.md "Multipliers"): PAM, L-Mul, corrected PAM, the
exact product and the float multiplier, as frozen :class:`Multiplier` values with names
that parse and round-trip through ``str()``.

Names (the grammar of :func:`multiplier`):

* ``pam``, ``pam+3``, ``pam-2``: PAM, plus an offset in ULPs of the operand format;
* ``lmul``, ``lmul+3``: L-Mul (PAM plus 2^-l(M)), plus an offset in ULPs;
* ``cpam2-unbiased``, ``cpam2-minimax`` (k = 1..4): corrected PAM with the shipped table
  of mantissa width M (``cpam_table``); ``cpam1:0,1,1,0``: a table given as data,
  4^k integers in ULPs, row-major (row: the first operand's top k mantissa bits);
* ``exact``: the product rounded (RNE) into the format, subnormals kept (``fp_mul``);
* ``float``: ``fp_mul(..., subnormals=False)``, the RTL float MAC's product;
* ``table:NAME``: any function of two operands of a format of at most 8 bits, as the
  table of its products (:func:`table_multiplier` registers NAME; ``table:PATH.npy``
  reads a float table from a file).

:data:`MULTIPLIERS` holds the named members.  :func:`mul` is ``emu.mul``;
:func:`error_stats` the bias, maximum and RMS relative error of a multiplier in a format.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import _scalar as S
from . import _scalar_mul as SM
from .formats import Format, float32, format
from .backend import backend_for as _backend_for
from .host import HOST, HostBackend
from .shapes import elementwise

__all__ = ["Multiplier", "MULTIPLIERS", "multiplier", "mul", "table_multiplier", "Table",
           "table_of",
           "save_table", "table_dir", "lmul_level",
           "TABLE_MAX_WIDTH", "TABLE_OUT_FORMATS", "cpam_table", "search_cpam_table",
           "ErrorStats", "error_stats", "KINDS", "CPAM_GOALS", "CPAM_MAX_MAN_BITS"]

#: the kinds of multiplier
KINDS = ("pam", "lmul", "cpam", "exact", "float", "table")
#: table multipliers: operand formats up to this width, results in these formats
TABLE_MAX_WIDTH = 8
TABLE_OUT_FORMATS = ("bfloat16", "float16", "float32")
#: the shipped corrected-PAM tables: zero mean per cell, or smallest maximum per cell
CPAM_GOALS = ("unbiased", "minimax")
#: shipped tables exist for mantissa widths 1..CPAM_MAX_MAN_BITS (exhaustive search)
CPAM_MAX_MAN_BITS = 10
CPAM_MAX_K = 4
_MAX_OFFSET = 1 << 23          # |offset| below one float32 binade of ULPs
_TABLES_FILE = Path(__file__).with_name("cpam_tables.json")


@dataclass(frozen=True)
class Multiplier:
    """One multiplier.  ``offset``: ULPs of the operand format added to the pattern sum
    (``pam``, ``lmul``); ``k`` and ``table`` (``cpam``): the index bits per operand and a
    goal of :data:`CPAM_GOALS` or 4^k integers in ULPs."""
    kind: str
    offset: int = 0
    k: int = 0
    table: str | tuple = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not a multiplier kind; expected one of "
                             f"{list(KINDS)}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) \
                or abs(self.offset) >= _MAX_OFFSET:
            raise ValueError(f"offset={self.offset!r}: expected an int of magnitude below 2^23")
        if self.offset and self.kind not in ("pam", "lmul"):
            raise ValueError(f"offset={self.offset!r}: only pam and lmul take an offset")
        if self.kind == "table":
            if self.k or not isinstance(self.table, str) or not self.table:
                raise ValueError(f"k={self.k!r}, table={self.table!r}: a table multiplier "
                                 "takes its registered name (or a .npy path) as table")
            return
        if self.kind != "cpam":
            if self.k or self.table != "":
                raise ValueError(f"k={self.k!r}, table={self.table!r}: only cpam takes a table")
            return
        if isinstance(self.k, bool) or not isinstance(self.k, int) \
                or not 1 <= self.k <= CPAM_MAX_K:
            raise ValueError(f"k={self.k!r}: expected an int in 1..{CPAM_MAX_K}")
        if isinstance(self.table, str):
            if self.table not in CPAM_GOALS:
                raise ValueError(f"table={self.table!r}: expected one of {list(CPAM_GOALS)} "
                                 f"or a tuple of {4 ** self.k} ints")
        elif not (isinstance(self.table, tuple) and len(self.table) == 4 ** self.k
                  and all(isinstance(t, int) and not isinstance(t, bool)
                          and abs(t) < _MAX_OFFSET for t in self.table)):
            raise ValueError(f"table={self.table!r}: expected one of {list(CPAM_GOALS)} or a "
                             f"tuple of {4 ** self.k} ints of magnitude below 2^23")

    def __str__(self) -> str:
        if self.kind == "table":
            return f"table:{self.table}"
        if self.kind == "cpam":
            if isinstance(self.table, str):
                return f"cpam{self.k}-{self.table}"
            return f"cpam{self.k}:" + ",".join(map(str, self.table))
        return self.kind + (f"{self.offset:+d}" if self.offset else "")

    def params(self, fmt: Format | str = float32) -> SM.MulParams:
        """The multiplier in ``fmt`` as the kernels take it (emu/_scalar_mul.py's
        ``MulParams``); ValueError if it has no table for ``fmt``."""
        fmt = format(fmt).arithmetic()
        if self.kind == "table":
            return _table(self.table).params(fmt, str(self))
        ulp = 1 << (23 - fmt.man_bits)      # one ULP of fmt in float32-pattern units
        table = np.zeros(1, np.int64)
        if self.kind == "cpam":
            if self.k > fmt.man_bits:
                raise ValueError(f"mul={str(self)!r} indexes {self.k} mantissa bits; "
                                 f"fmt={fmt.name} has {fmt.man_bits}")
            table = np.array(self.table if isinstance(self.table, tuple)
                             else cpam_table(fmt.man_bits, self.k, self.table), np.int64) * ulp
        kind = {"exact": SM.EXACT, "float": SM.FLOAT}.get(self.kind, SM.SUM)
        c = self.offset * ulp + (1 << (23 - lmul_level(fmt.man_bits)) if self.kind == "lmul" else 0)
        return SM.MulParams(kind, c, table, self.k)

    @property
    def constant(self) -> bool:
        """Whether the product is PAM's pattern sum plus one constant (``pam``, ``lmul`` and
        their offsets): the matmul fast paths take it unchanged."""
        return self.kind in ("pam", "lmul")


def lmul_level(man_bits: int) -> int:
    """L-Mul's l(M): M for M <= 3, 3 for M = 4, 4 for M > 4 (Luo & Sun, 2024)."""
    return man_bits if man_bits <= 3 else (3 if man_bits == 4 else 4)


_NAME = re.compile(r"(?P<kind>pam|lmul)(?P<off>[+-][1-9]\d*)?|exact|float"
                   r"|cpam(?P<k>\d+)(?:-(?P<goal>\w+)|:(?P<table>-?\d+(?:,-?\d+)*))"
                   r"|table:(?P<tname>.+)")


def multiplier(spec) -> Multiplier:
    """The :class:`Multiplier` named ``spec`` (module docstring), or ``spec`` itself."""
    if isinstance(spec, Multiplier):
        return spec
    m = _NAME.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"mul={spec!r} is not a multiplier; expected one of "
                         f"{list(MULTIPLIERS)}, pam/lmul with an offset in ULPs ('lmul+3', "
                         "'pam-2'), cpamK:T (4^K integers, e.g. 'cpam1:0,1,1,0') or "
                         "table:NAME (emu.table_multiplier) / table:PATH.npy")
    if m["tname"]:
        _table(m["tname"])          # ValueError if it is neither registered nor a file
        return Multiplier("table", table=m["tname"])
    if m["kind"]:
        try:
            return Multiplier(m["kind"], int(m["off"] or 0))
        except ValueError as exc:
            raise ValueError(f"mul={spec!r}: {exc}") from None
    if m["k"] is None:
        return Multiplier(spec)
    try:
        mult = Multiplier("cpam", k=int(m["k"]), table=m["goal"] if m["goal"] is not None
                          else tuple(int(t) for t in m["table"].split(",")))
    except ValueError as exc:
        raise ValueError(f"mul={spec!r}: {exc}") from None
    if str(mult) != spec:
        raise ValueError(f"mul={spec!r}: write it as {str(mult)!r}")
    return mult


#: the named multipliers, by name
MULTIPLIERS = {str(m): m for m in (
    Multiplier("pam"), Multiplier("lmul"), Multiplier("exact"), Multiplier("float"),
    *(Multiplier("cpam", k=k, table=g) for k in range(1, CPAM_MAX_K + 1) for g in CPAM_GOALS))}


# --- table multipliers ---------------------------------------------------------------

class Table(NamedTuple):
    """A table multiplier's data: ``values[e_a, e_b]`` the float32 product of the
    operands encoded ``e_a``, ``e_b`` (NaNs canonical) in ``fmt`` (None: any format of
    the table's width, for a table read from a file), with its source and SHA-256;
    ``out``: the format of its entries (a file's: the narrowest of
    :data:`TABLE_OUT_FORMATS` that holds every value)."""
    fmt: Format | None
    values: np.ndarray
    source: str
    sha256: str
    out: Format = float32

    def params(self, fmt: Format, name: str) -> SM.MulParams:
        w = fmt.width
        if w > TABLE_MAX_WIDTH or self.values.shape != (1 << w, 1 << w):
            raise ValueError(f"mul={name!r} is a {self.values.shape[0]}x{self.values.shape[1]} "
                             f"table; fmt={fmt.name} ({w} bits) needs {1 << w}x{1 << w} (table "
                             f"multipliers take formats of at most {TABLE_MAX_WIDTH} bits)")
        if self.fmt is not None and self.fmt != fmt:
            raise ValueError(f"mul={name!r} is a table of {self.fmt.name} operands, not of "
                             f"fmt={fmt.name}")
        pat = self.values.reshape(-1).view(np.uint32).astype(np.int64)
        return SM.MulParams(SM.TABLE, 0, pat, w)


def check_out_format(fmt: Format, out_fmt) -> Format:
    """A table multiplier's result format: one of :data:`TABLE_OUT_FORMATS` or ``fmt``."""
    out = format(out_fmt, argname="out_fmt")
    if out.name not in TABLE_OUT_FORMATS and out != fmt:
        raise ValueError(f"out_fmt={out.name!r}; expected one of {list(TABLE_OUT_FORMATS)} "
                         f"or the operand format {fmt.name!r}")
    return out


_TABLE_MULTIPLIERS: dict[str, Table] = {}
_TABLE_NAME = r"[A-Za-z0-9_.+-]+"


def _canonical(values) -> np.ndarray:
    v = np.ascontiguousarray(values, np.float32).copy()
    v[np.isnan(v)] = np.float32(np.nan)                 # the canonical NaN
    return v


def _decode(bits, fmt: Format) -> np.ndarray:
    """emu.from_bits on the host (this module sits below emu.ops, which imports emu.mx)."""
    return HOST.from_bits(elementwise("from_bits", fmt.consts, bits=bits), bits, fmt)


def _round(x, fmt: Format) -> np.ndarray:
    """emu.quantize (RNE) on the host of values made float32 first (RNE)."""
    xv = HostBackend.operand(np.asarray(x, np.float32), "source")
    return HOST.quantize(elementwise("quantize", fmt.consts, x=xv), xv, S.RNE, True, False, 0)


def table_dir() -> Path:
    """Where saved table multipliers live (:func:`save_table`): ``$PAMSIM_MULTIPLIERS``,
    else ``~/.pamsim/multipliers``."""
    return Path(os.environ.get("PAMSIM_MULTIPLIERS", "~/.pamsim/multipliers")).expanduser()


def table_of(mul) -> Table:
    """The data of the table multiplier ``mul`` (a ``table:`` name or its Multiplier)."""
    m = multiplier(mul)
    if m.kind != "table":
        raise ValueError(f"mul={str(m)!r} is not a table multiplier")
    return _table(m.table)


def save_table(m: Multiplier, **meta) -> Path:
    """Keep the registered table multiplier ``m`` under :func:`table_dir` (its values,
    operand format, source, SHA-256 and ``meta``, e.g. the hash of the Verilog it came
    from), so that ``table:NAME`` finds it in every later process."""
    t = _table(multiplier(m).table)
    if t.fmt is None:
        raise ValueError(f"mul={str(m)!r} is a file table without an operand format; "
                         "register it with emu.table_multiplier first")
    path = table_dir() / f"{m.table}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    info = dict(meta, fmt=t.fmt.name, source=t.source, sha256=t.sha256, out_fmt=t.out.name)
    np.savez(path, values=t.values, info=np.array(json.dumps(info)))
    return path


def _table(name: str) -> Table:
    """The registered table ``name``, else one saved under :func:`table_dir`, else the
    .npy file of that path (each read once)."""
    if name in _TABLE_MULTIPLIERS:
        return _TABLE_MULTIPLIERS[name]
    saved = table_dir() / f"{name}.npz"
    if re.fullmatch(_TABLE_NAME, name) and saved.is_file():
        with np.load(saved, allow_pickle=False) as z:
            info = json.loads(str(z["info"]))
            v = _canonical(z["values"])
        _TABLE_MULTIPLIERS[name] = Table(format(info["fmt"]), v, info["source"],
                                         info["sha256"], format(info["out_fmt"]))
        return _TABLE_MULTIPLIERS[name]
    path = Path(name)
    if path.suffix != ".npy" or not path.is_file():
        raise ValueError(f"mul='table:{name}': no table multiplier of that name is registered "
                         "(emu.table_multiplier) and it is not a .npy file")
    values = np.load(path, allow_pickle=False)
    if values.dtype.kind != "f" or values.ndim != 2:
        raise ValueError(f"mul='table:{name}': the file holds a {values.dtype} array of shape "
                         f"{values.shape}; expected a 2-D float array of products")
    v = _canonical(values)
    out = next(format(f) for f in TABLE_OUT_FORMATS
               if np.array_equal(_round(v, format(f)).view(np.uint32), v.view(np.uint32)))
    _TABLE_MULTIPLIERS[name] = Table(None, v, str(path),
                                     hashlib.sha256(v.tobytes()).hexdigest(), out)
    return _TABLE_MULTIPLIERS[name]


def table_multiplier(source, fmt, out_fmt="float32", *, name: str | None = None) -> Multiplier:
    """A table multiplier for operands of ``fmt`` (at most 8 bits), registered as
    ``table:NAME`` (``name``, default the first 12 hex digits of the table's SHA-256).

    ``source``: a 2^w x 2^w array (integers: encodings in ``out_fmt``; floats: values,
    made float32 (RNE), then rounded RNE into ``out_fmt``), the path of a ``.npy`` file of one, or a function of
    two floats (every pair of values of ``fmt``, rounded into ``out_fmt``).  Row: the
    first operand's encoding; column: the second's.  ``out_fmt``: one of
    :data:`TABLE_OUT_FORMATS` or ``fmt`` itself (a multiplier whose products are
    operands again, as pamsim's own RTL multipliers)."""
    fmt = format(fmt, argname="fmt").arithmetic()
    out = check_out_format(fmt, out_fmt)
    w = fmt.width
    if w > TABLE_MAX_WIDTH:
        raise ValueError(f"fmt={fmt.name} has {w} bits; table multipliers take formats of at "
                         f"most {TABLE_MAX_WIDTH} bits (the table has 4^w entries)")
    src = str(source) if isinstance(source, (str, Path)) else type(source).__name__
    if isinstance(source, (str, Path)):
        source = np.load(source, allow_pickle=False)
    if callable(source):
        vals = _decode(np.arange(1 << w, dtype=np.uint32), fmt).astype(np.float64)
        table = np.array([[source(float(x), float(y)) for y in vals] for x in vals], np.float64)
    else:
        table = np.asarray(source)
    if table.shape != (1 << w, 1 << w) or table.dtype.kind not in "fiu":
        raise ValueError(f"source: a {table.dtype} array of shape {table.shape}; expected "
                         f"{1 << w}x{1 << w} numbers for fmt={fmt.name}")
    if table.dtype.kind in "iu":
        if table.min() < 0 or table.max() >= 1 << out.width:
            raise ValueError(f"source: encodings must lie in [0, 2^{out.width}) for "
                             f"out_fmt={out.name}")
        values = _decode(table.astype(np.uint32), out)
    else:
        values = _round(table, out)
    v = _canonical(values)
    sha = hashlib.sha256(v.tobytes()).hexdigest()
    name = sha[:12] if name is None else name
    if not isinstance(name, str) or not re.fullmatch(_TABLE_NAME, name) \
            or name.endswith(".npy"):
        raise ValueError(f"name={name!r}: expected letters, digits and _.+- (not a .npy path)")
    _TABLE_MULTIPLIERS[name] = Table(fmt, v, src, sha, out)
    return Multiplier("table", table=name)


def mul(a, b, fmt: Format | str = float32, mul="pam"):
    """The product of ``a`` and ``b`` in ``fmt`` by the multiplier ``mul`` (a name or a
    :class:`Multiplier`): operands rounded (RNE) into ``fmt``, then the multiplier's rule
    (docs/semantics.md "Multipliers").  Host (numpy) or CUDA operands, broadcast like
    ``emu.pam_mul``; ``mul="pam"`` is ``emu.pam_mul``."""
    return _product(a, b, fmt, multiplier(mul))


def _product(a, b, fmt, m: Multiplier, stream=None):
    fc = format(fmt).consts
    backend, (av, bv) = _backend_for(stream, {"a": a, "b": b})
    return backend.mul(elementwise("mul", fc, a=av, b=bv), av, bv, m.params(fmt))


def _product_grad(a, b, dy, fmt, m: Multiplier, stream=None):
    """The exact (δA, δB) of ``mul(a, b, fmt, m)`` at δY = ``dy`` (emu.grad.mul)."""
    fc = format(fmt).consts
    backend, ops = _backend_for(stream, {"a": a, "b": b, "dy": dy})
    return backend.mul_grad(elementwise("mul", fc, **dict(zip(("a", "b", "dy"), ops))), *ops,
                            m.params(fmt))


# --- corrected PAM tables: exhaustive search over integer corrections -------------------

def _rel_error(i, j, c, man_bits):
    """Relative error of paexp2(palog2 a + palog2 b + c 2^-M) against a b, for the
    mantissas a = 1 + i 2^-M, b = 1 + j 2^-M (float64: exact to 2^-52 relative)."""
    n = 1 << man_bits
    s = i + j + c                                   # the pattern sum's fraction, in ULPs
    fl = s >> man_bits                              # the carry (or borrow) into the exponent
    approx = np.ldexp(1 + (s - (fl << man_bits)) / n, fl)
    return approx / ((1 + i / n) * (1 + j / n)) - 1


def _cell(man_bits, k, ci, cj):
    """The mantissa index pairs (i, j) whose top k bits are (ci, cj)."""
    w = 1 << (man_bits - k)
    i, j = np.meshgrid(np.arange(ci * w, (ci + 1) * w), np.arange(cj * w, (cj + 1) * w),
                       indexing="ij")
    return i.ravel(), j.ravel()


_TIE = 1e-12        # objective values this close count as equal (float64 noise)


def _first(pred, lo, hi):
    """The smallest c in (lo, hi] with pred(c), for pred monotone, false at lo, true at hi."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pred(mid) else (mid, hi)
    return hi


def _best(objective, candidates):
    """The candidate of smallest objective; within _TIE, the smaller |c|, then c."""
    vals = {c: objective(c) for c in candidates}
    low = min(vals.values())
    return min((c for c, v in vals.items() if v <= low + _TIE), key=lambda c: (abs(c), c))


def search_cpam_table(man_bits: int, k: int, goal: str) -> tuple:
    """The corrected-PAM table for mantissa width ``man_bits``, ``k`` index bits and
    ``goal`` ("unbiased": per cell, the integer correction whose mean relative error over
    the cell's mantissa pairs is closest to 0; "minimax": per cell, the smallest maximum
    |relative error|), by search over every integer c in [-2^M, 2^M] ULPs.

    Every pair's error strictly increases with c (paexp2 is increasing), it is negative
    for every pair at c = -2^M and positive at 2^M (PAM's error lies in [-1/9, 0]), so
    the cell mean crosses 0 once and max|error| is smallest where the largest error
    meets minus the smallest: bisection finds the crossing, and the two candidates
    beside it are compared (docs/semantics.md "Multipliers")."""
    if goal not in CPAM_GOALS:
        raise ValueError(f"goal={goal!r}: expected one of {list(CPAM_GOALS)}")
    n = 1 << man_bits
    out = []
    for ci in range(1 << k):
        for cj in range(1 << k):
            i, j = _cell(man_bits, k, ci, cj)
            @functools.lru_cache(maxsize=None)
            def err(c, i=i, j=j):
                return _rel_error(i, j, c, man_bits)

            if goal == "unbiased":
                c0 = _first(lambda c: err(c).mean() > 0, -n, n)
                out.append(_best(lambda c: abs(err(c).mean()), (c0 - 1, c0)))
            else:
                c0 = _first(lambda c: err(c).max() + err(c).min() >= 0, -n, n)
                out.append(_best(lambda c: np.abs(err(c)).max(), (c0 - 1, c0)))
    return tuple(int(c) for c in out)


_CPAM_TABLES: dict = {}


def cpam_table(man_bits: int, k: int, goal: str) -> tuple:
    """The shipped table (emu/cpam_tables.json, written by :func:`write_cpam_tables`)."""
    if not _CPAM_TABLES:
        _CPAM_TABLES.update(json.loads(_TABLES_FILE.read_text()))
    if not k <= man_bits <= CPAM_MAX_MAN_BITS:
        raise ValueError(f"cpam{k}-{goal}: tables are shipped for mantissa widths "
                         f"{k}..{CPAM_MAX_MAN_BITS}, not {man_bits}; give a table as data "
                         f"('cpam{k}:...')")
    return tuple(_CPAM_TABLES[goal][str(man_bits)][str(k)])


def write_cpam_tables(path: Path = _TABLES_FILE) -> None:
    """Compute every shipped table (:func:`search_cpam_table`) and write them as JSON."""
    tables = {g: {str(m): {str(k): list(search_cpam_table(m, k, g))
                           for k in range(1, min(m, CPAM_MAX_K) + 1)}
                  for m in range(1, CPAM_MAX_MAN_BITS + 1)} for g in CPAM_GOALS}
    path.write_text(json.dumps(tables, separators=(",", ":")) + "\n")


# --- error statistics --------------------------------------------------------------------

class ErrorStats(NamedTuple):
    """Relative error of a multiplier over mantissa pairs: ``mean`` (the bias), ``min``,
    ``max``, ``max_abs``, ``rms``; ``pairs`` counted, ``exhaustive`` or sampled."""
    mul: str
    fmt: str
    pairs: int
    exhaustive: bool
    mean: float
    min: float
    max: float
    max_abs: float
    rms: float


def error_stats(mul, fmt: Format | str = float32, samples: int = 1 << 20,
                seed: int = 0) -> ErrorStats:
    """Relative error ``mul(a, b) / (a b) - 1`` over every pair of normal mantissas of
    ``fmt`` (operands in [1, 2)) where there are at most 2^20 pairs (every format of up to
    16 bits), else over ``samples`` random pairs (``seed``).  Away from the ends of the
    range a product's relative error depends only on the operands' mantissas, so these
    are the statistics over every pair of normal operands whose product stays normal.
    A table multiplier has no such invariance: its statistics are over every pair of
    normal operands whose exact product is a normal value of ``fmt``."""
    m = multiplier(mul)
    fmt = format(fmt).arithmetic()
    n = 1 << fmt.man_bits
    exhaustive = n * n <= 1 << 20
    if m.kind == "table":       # no scale invariance: every pair of normal operands
        v = _decode(np.arange(1 << fmt.width, dtype=np.uint32), fmt)
        v = v[np.isfinite(v) & (np.abs(v) >= fmt.smallest_normal)]
        a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
        exact = a.astype(np.float64) * b
        keep = (np.abs(exact) >= fmt.smallest_normal) & (np.abs(exact) <= fmt.max)
        a, b, exact = a[keep], b[keep], exact[keep]
        err = np.asarray(_product(a, b, fmt, m), np.float64) / exact - 1
        return ErrorStats(str(m), fmt.name, int(err.size), True, float(err.mean()),
                          float(err.min()), float(err.max()), float(np.abs(err).max()),
                          float(math.sqrt((err ** 2).mean())))
    if exhaustive:
        i, j = (v.ravel() for v in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    else:
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples={samples!r}: expected a positive int")
        i, j = np.random.default_rng(seed).integers(0, n, (2, samples))
    a = (1 + i / n).astype(np.float32)
    b = (1 + j / n).astype(np.float32)
    err = np.asarray(_product(a, b, fmt, m), np.float64) / (a.astype(np.float64) * b) - 1
    return ErrorStats(str(m), fmt.name, int(err.size), exhaustive, float(err.mean()),
                      float(err.min()), float(err.max()), float(np.abs(err).max()),
                      float(math.sqrt((err ** 2).mean())))
