"""Analytic 45 nm energy/area model of float, integer and piecewise-affine arithmetic.

The anchors are Table 4 of Kosson & Jaggi (papers/004, from Horowitz, ISSCC 2014),
read from ``costs/data/ops45nm.csv``.  Between and beyond the anchors each operation
family follows one scaling law, stated and justified in docs/costs.md:

* integer adder of n bits: log-log piecewise linear through int8/16/32 (the fitted
  exponents are 0.74-1.03, i.e. ~linear in n, as a carry chain is);
* integer multiplier of n bits: a power law through int8 and int32 (exponent ~2 in
  energy: the n x n partial-product array);
* float multiplier (E, M): a power law in the significand width w = M+1 for the
  (M+1) x (M+1) significand product (+ normalise/round), plus an E-bit integer adder
  for the exponents; the power law goes through float16 and float32 exactly;
* float adder (E, M): a power law in w for alignment shift, add and normalisation,
  plus an E-bit adder for the exponent difference; exact at float16 and float32.

PAM (eqs. 4-8) is an integer add of the bit patterns plus the exponent bias/range
check; Appendix B prices it as two full-width integer adds (``rule="paper"``).  A MAC is
a multiply plus an add in the accumulator's format (Appendix B: "the sum of the costs").
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import emu
from emu.multipliers import table_of

__all__ = ["Cost", "int_add", "int_mul", "fp_add", "fp_mul", "pam_mul", "pa_div", "mul_cost", "mac",
           "PAM_RULES", "table_rows", "memory_pj_per_byte", "MEMORY_LEVELS",
           "scaling_laws", "appendix_b", "Comparison", "savings_rows"]

#: How PAM is priced.  "paper": Kosson & Jaggi App. B, "one full int32 addition and one
#: int8 addition for the exponent which also needs to check for under/overflow ...
#: comparable to two int32 additions", i.e. 2 x int_add(width).  "adders": only the two
#: adders of the datapath, int_add(E+M) (sign by XOR) + int_add(E) (bias), no clamp or
#: special-value logic: a lower bound.
PAM_RULES = ("paper", "adders")


@dataclass(frozen=True)
class Cost:
    """Energy per operation (pJ) and silicon area (µm²) at 45 nm."""
    energy_pj: float
    area_um2: float

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.energy_pj + other.energy_pj, self.area_um2 + other.area_um2)

    def __sub__(self, other: "Cost") -> "Cost":
        return Cost(self.energy_pj - other.energy_pj, self.area_um2 - other.area_um2)

    def __mul__(self, k: float) -> "Cost":
        return Cost(k * self.energy_pj, k * self.area_um2)

    __rmul__ = __mul__

    def ratio(self, baseline: "Cost") -> tuple[float, float]:
        """(energy, area) of this cost as fractions of ``baseline``'s."""
        return self.energy_pj / baseline.energy_pj, self.area_um2 / baseline.area_um2


def _read_csv(name: str) -> list[dict]:
    text = resources.files("costs").joinpath("data", name).read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


@lru_cache(maxsize=None)
def _table() -> dict[tuple[str, str], Cost]:
    return {(r["op"], r["dtype"]): Cost(float(r["energy_pj"]), float(r["area_um2"]))
            for r in _read_csv("ops45nm.csv")}


def table_rows() -> list[dict]:
    """The rows of the data file (op, dtype, energy_pj, area_um2, source)."""
    return _read_csv("ops45nm.csv")


@lru_cache(maxsize=None)
def _memory() -> dict[str, tuple[float, str]]:
    return {r["level"]: (float(r["energy_pj_per_64bit"]) / 8, r["source"])
            for r in _read_csv("memory45nm.csv")}


MEMORY_LEVELS = ("sram_8kb", "sram_32kb", "sram_1mb", "dram", "dram_high")


def memory_pj_per_byte(level: str = "dram") -> float:
    """Energy of moving one byte to/from memory ``level`` (Horowitz 2014: 64-bit access / 8)."""
    table = _memory()
    if level not in table:
        raise ValueError(f"memory={level!r}; expected one of {sorted(table)}")
    return table[level][0]


class _Law:
    """A log-log piecewise-linear law through anchor points (width, value).

    Anchor widths return the anchor value itself; outside the anchors the nearest
    segment's exponent continues (a power law), so the law is monotonic whenever the
    anchors increase.
    """

    def __init__(self, anchors: list[tuple[int, float]]):
        self.anchors = sorted(anchors)
        if len(self.anchors) < 2 or any(v <= 0 for _, v in self.anchors):
            raise ValueError("a scaling law needs >= 2 positive anchors")
        self.exponents = [math.log(v1 / v0) / math.log(w1 / w0)
                          for (w0, v0), (w1, v1) in zip(self.anchors, self.anchors[1:])]

    def __call__(self, width: float) -> float:
        for w, v in self.anchors:
            if width == w:
                return v
        seg = 0
        while seg < len(self.exponents) - 1 and width > self.anchors[seg + 1][0]:
            seg += 1
        w0, v0 = self.anchors[seg]
        return v0 * (width / w0) ** self.exponents[seg]


class _CostLaw:
    """Energy and area laws of one operation family."""

    def __init__(self, anchors: list[tuple[int, Cost]]):
        self.energy = _Law([(w, c.energy_pj) for w, c in anchors])
        self.area = _Law([(w, c.area_um2) for w, c in anchors])

    def __call__(self, width: float) -> Cost:
        return Cost(self.energy(width), self.area(width))


def _check_bits(bits, argname="bits") -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 1:
        raise ValueError(f"{argname} must be a positive int (integer width), got {bits!r}")
    return bits


@lru_cache(maxsize=None)
def _laws() -> dict[str, _CostLaw]:
    t = _table()
    int_add_law = _CostLaw([(8, t["add", "int8"]), (16, t["add", "int16"]),
                            (32, t["add", "int32"])])
    laws = {"int_add": int_add_law,
            "int_mul": _CostLaw([(8, t["mul", "int8"]), (32, t["mul", "int32"])])}
    # Float laws: the table entry minus the E-bit exponent adder is the significand
    # datapath, anchored at w = M+1 = 11 (float16) and 24 (float32).
    for op in ("mul", "add"):
        anchors = []
        for name in ("float16", "float32"):
            fmt = emu.format(name)
            sig = t[op, name] - int_add_law(fmt.exp_bits)
            anchors.append((fmt.man_bits + 1, sig))
        laws[f"fp_{op}_significand"] = _CostLaw(anchors)
    return laws


def int_add(bits: int) -> Cost:
    """An n-bit integer adder (Table 4 anchors int8/16/32, ~linear in n)."""
    return _laws()["int_add"](_check_bits(bits))


def int_mul(bits: int) -> Cost:
    """An n-bit integer multiplier (Table 4 anchors int8/int32, power law ~ n²)."""
    return _laws()["int_mul"](_check_bits(bits))


def fp_mul(fmt) -> Cost:
    """An IEEE multiplier in ``fmt``: (M+1)x(M+1) significand product + E-bit exponent add."""
    fmt = emu.format(fmt)
    return _laws()["fp_mul_significand"](fmt.man_bits + 1) + int_add(fmt.exp_bits)


def fp_add(fmt) -> Cost:
    """An IEEE adder in ``fmt``: (M+1)-bit align/add/normalise + E-bit exponent difference."""
    fmt = emu.format(fmt)
    return _laws()["fp_add_significand"](fmt.man_bits + 1) + int_add(fmt.exp_bits)


def _check_rule(rule: str) -> str:
    if rule not in PAM_RULES:
        raise ValueError(f"rule={rule!r}; expected one of {PAM_RULES}")
    return rule


def pam_mul(fmt, rule: str = "paper") -> Cost:
    """Piecewise affine multiplication (eqs. 4-8) in ``fmt``; see :data:`PAM_RULES`."""
    fmt = emu.format(fmt)
    if _check_rule(rule) == "paper":
        return int_add(fmt.width) * 2
    return int_add(fmt.exp_bits + fmt.man_bits) + int_add(fmt.exp_bits)


def pa_div(fmt, rule: str = "paper") -> Cost:
    """PA division: the same datapath as PAM with a subtraction (eq. 9)."""
    return pam_mul(fmt, rule)


def _rom(words: int, bits: int) -> Cost:
    """A ROM of ``words`` entries of ``bits`` bits, modelled as its mux tree: (words - 1)
    2:1 multiplexers per bit, each priced as one bit of the int32 adder
    (int_add(32) / 32).  The data have no ROM or mux figure: Horowitz's smallest memory
    (an 8 KB SRAM, 10 pJ per 64-bit access) prices decoders and bit lines of arrays
    thousands of times larger than a 16-word table."""
    return int_add(32) * ((words - 1) * bits / 32)


#: a 6T SRAM bit cell at 45 nm (Intel: Mistry et al., IEDM 2007), cells only
SRAM_BIT_UM2 = 0.346
_SRAM_BYTES = {"sram_8kb": 8 << 10, "sram_32kb": 32 << 10, "sram_1mb": 1 << 20}


def _table_memory(words: int, bits: int) -> Cost:
    """A table of ``words`` entries of ``bits`` bits read once: the energy of an access to
    the smallest SRAM level of Horowitz's figure that holds it, per bit read (a 64 Ki x
    16-bit table: the 1 MB level), and the area of its bit cells (:data:`SRAM_BIT_UM2`;
    decoders and sense amplifiers excluded, so a lower bound).  A table beyond 1 MB has
    no figure: ValueError."""
    size = words * bits / 8
    level = next((lv for lv, cap in _SRAM_BYTES.items() if size <= cap), None)
    if level is None:
        raise ValueError(f"a table of {words} x {bits} bits ({size:,.0f} bytes) is beyond the "
                         "largest SRAM of the data (1 MB)")
    return Cost(memory_pj_per_byte(level) * bits / 8, words * bits * SRAM_BIT_UM2)


def _word_bits(values) -> int:
    """Bits of a two's-complement word holding every integer in ``values`` (at least 1)."""
    lo, hi = min(values), max(values)
    bits = max(int(hi).bit_length(), int(-lo - 1).bit_length() if lo < 0 else 0)
    return bits + (lo < 0) if bits or lo < 0 else 1


def mul_cost(mul, fmt, rule: str = "paper") -> Cost:
    """The multiplier ``mul`` (an ``emu.multiplier`` name or an ``emu.Multiplier``) in
    ``fmt``:

    * a pattern sum with one constant (``pam``, ``lmul``, ``pam+3``, ...): PAM's datapath
      (:func:`pam_mul`); the constant is folded into the adder's carry-in and constant
      operand bits, so it costs nothing more;
    * corrected PAM (``cpamK-...``): PAM's datapath, plus a ROM of 2^(2K) corrections
      (each as wide as the table's largest entry in ULPs of ``fmt``, :func:`_rom`),
      plus a second add of the correction into the pattern sum (int_add(E+M), carrying
      into the exponent);
    * ``exact`` and ``float``: the IEEE multiplier :func:`fp_mul` (``exact`` fuses its add
      into the accumulator's: the MAC prices that add apart, as for ``float``);
    * a table multiplier (``table:NAME``): one read of a memory of its 2^(2w) entries as
      wide as their format (:func:`_table_memory`), and nothing else.

    ValueError for a corrected PAM or a table that does not fit ``fmt``."""
    m = emu.multiplier(mul)
    fmt = emu.format(fmt)
    if m.kind in ("exact", "float"):
        return fp_mul(fmt)
    if m.kind == "table":
        m.params(fmt)                   # ValueError if the table is not of fmt
        return _table_memory(4 ** fmt.width, table_of(m).out.width)
    cost = pam_mul(fmt, rule)
    if m.kind != "cpam":
        return cost
    ulp = 1 << (23 - fmt.arithmetic().man_bits)
    table = [int(t) // ulp for t in m.params(fmt).table]
    return cost + _rom(4 ** m.k, _word_bits(table)) + int_add(fmt.exp_bits + fmt.man_bits)


def mac(fmt, acc, mul="float", rule: str = "paper") -> Cost:
    """One multiply-accumulate: the multiplier ``mul`` in ``fmt`` (:func:`mul_cost`; an
    ``emu.multiplier`` name such as "float", "pam", "lmul", "cpam2-unbiased", or an
    ``emu.Multiplier``) plus an add in ``acc``."""
    return mul_cost(mul, fmt, rule) + fp_add(emu.format(acc, argname="acc"))


def scaling_laws() -> list[dict]:
    """Each family's anchors and fitted log-log exponents (energy, area) for the docs/CLI."""
    rows = []
    for name, law in _laws().items():
        rows.append({"family": name,
                     "anchors": [w for w, _ in law.energy.anchors],
                     "energy_exponents": law.energy.exponents,
                     "area_exponents": law.area.exponents})
    return rows


@dataclass(frozen=True)
class Comparison:
    """One of the paper's Appendix B ratios, recomputed from the data table."""
    what: str
    energy: float          # fraction
    area: float
    paper_energy_pct: float
    paper_area_pct: float


def appendix_b() -> list[Comparison]:
    """Kosson & Jaggi App. B: float32 PAM vs float32/float16 multiply, and the two MACs."""
    f32, f16 = emu.float32, emu.float16
    pam = pam_mul(f32, "paper")
    rows = [("float32 PAM vs float32 multiply", pam, fp_mul(f32), 5.4, 3.6),
            ("float32 PAM vs float16 multiply", pam, fp_mul(f16), 18, 17),
            ("PAM MAC vs float32-multiply float32-accumulate",
             pam + fp_add(f32), mac(f32, f32), 24, 38),
            ("PAM MAC vs float16-multiply float32-accumulate",
             pam + fp_add(f32), mac(f16, f32), 55, 77)]
    return [Comparison(what, *c.ratio(base), pe, pa) for what, c, base, pe, pa in rows]


def savings_rows(fmt, acc, rule: str = "paper") -> dict:
    """Multiply-only and per-MAC costs of PAM against the float multiplier in ``fmt``."""
    fmt = emu.format(fmt)
    acc = emu.format(acc, argname="acc")
    fmul, pam, add = fp_mul(fmt), pam_mul(fmt, rule), fp_add(acc)
    return {"fmt": fmt, "acc": acc, "rule": rule, "fp_mul": fmul, "pam_mul": pam,
            "acc_add": add, "float_mac": fmul + add, "pam_mac": pam + add,
            "mul_ratio": pam.ratio(fmul), "mac_ratio": (pam + add).ratio(fmul + add)}
