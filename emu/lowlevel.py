"""emu's supported low-level API: what a package built on emu may use beyond the front
ends (``emu.quantize``, ``emu.pam_matmul``, ``emu.grad``, ...).

torch_bridge is its user.  Its per-call path runs emu's serial kernels on tensor memory
directly, and its fused composites are Numba kernels written with emu's scalar
definitions; both take them from here and never from emu's private modules, so emu can
reorganise those freely as long as these names keep their meaning.

Scalar definitions (``register_jitable``; float32 patterns held in int64, docs/semantics.md):

* ``scalar``: every operation's definition (``scalar.pam_mul(a, b, fc)``, ``scalar.quantize``,
  rounding codes ``scalar.RNE``/``RTZ``/``SR``, ``SIGN32``, ``ONE32``);
* ``scalar_grad``: their exact derivatives (Table 1);
* ``scalar_mul``: the multipliers (``scalar_mul.product(a, b, fc, mp)``, ``mp`` a
  multiplier's ``params(fmt)``; kind codes ``SUM``/``EXACT``/``FLOAT``);
* ``scalar_approx``: the approximate-derivative rules on one element
  (``scalar_approx.FLOAT32`` / ``GENERAL``, each a dict by ``<op>_approx``);
* ``fold``: emu.fold_sum's order on one strided run, ``as_f32``/``as_i32`` the bit casts.

Kernels (the serial twins take flat uint32 pattern arrays and ``fmt.consts``):

* ``QUANTIZE[parallel]``, ``UNARY_SERIAL[op]``, ``BINARY_SERIAL[op]``: rounding and the
  registry's elementwise ops;
* ``GRAD_UNARY_SERIAL[op]``, ``GRAD_BINARY_SERIAL[op]``, ``GRAD_APPROX[parallel][op]``: their
  exact and approximate derivatives;
* ``matmul_small``: the float32-accumulator matmul for at most ``sizes.SMALL``
  multiply-adds (by a pattern sum with one constant: ``c32``, 0 for PAM);
* ``VECTOR_LANES``: the matmul micro-kernel's lanes on this host (16 with AVX-512, else
  8; ``PAMSIM_VECTOR_LANES`` overrides it), ``RANGE_CLAMP``: whether the narrow
  accumulators' CLAMPED step clamps with one ``vrangeps`` (AVX-512DQ, 16 lanes), else
  it rounds in place;
* ``twins(variant, py_func)``: a prange loop compiled parallel and serial, cached;
  ``njit_variant(variant)``: one kernel of a factory, cached under ``variant``.

Host helpers: ``ln2_pattern(fmt)`` (the per-format ln2 of the approximate rules),
``ROUNDING`` / ``ROUNDING_ALIASES`` (rounding names to codes), ``drop_stale`` (Numba's
cache kept fresh for a module of cached kernels), ``dependency_digest`` (what a module's
kernels depend on, for kernels generated at run time), and ``sizes`` (every size
threshold).
"""
from . import _scalar as scalar
from . import _scalar_approx as scalar_approx
from . import _scalar_grad as scalar_grad
from . import _scalar_mul as scalar_mul
from . import sizes
from ._kernels import BINARY_SERIAL, QUANTIZE, UNARY_SERIAL, as_f32, as_i32, twins
from ._kernels import W as VECTOR_LANES
from ._kernels import _RANGE as RANGE_CLAMP
from ._kernels_grad import APPROX as GRAD_APPROX
from ._kernels_grad import BINARY_SERIAL as GRAD_BINARY_SERIAL
from ._kernels_grad import UNARY_SERIAL as GRAD_UNARY_SERIAL
from ._kernels_reduce import fold
from ._kernels_small import matmul_small
from ._numba_cache import dependency_digest, drop_stale, njit_variant
from ._scalar_approx import ln2_pattern
from .ops import ROUNDING, ROUNDING_ALIASES

__all__ = ["scalar", "scalar_grad", "scalar_mul", "scalar_approx", "sizes", "fold", "as_f32", "as_i32",
           "twins", "QUANTIZE", "UNARY_SERIAL", "BINARY_SERIAL", "GRAD_UNARY_SERIAL",
           "GRAD_BINARY_SERIAL", "GRAD_APPROX", "matmul_small", "drop_stale", "dependency_digest",
           "njit_variant", "ln2_pattern",
           "ROUNDING", "ROUNDING_ALIASES", "VECTOR_LANES", "RANGE_CLAMP"]
