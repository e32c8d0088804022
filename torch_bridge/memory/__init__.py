"""torch_bridge.memory — activations that keep less for the backward pass.

Few-bit backward (Novikov et al., ICML 2023): the forward is the native activation;
backward multiplies by an optimal piecewise-constant derivative (:func:`solve`,
eqs. 3-9) whose interval index is saved bit-packed, 1-8 bits per element
(:func:`fewbit`, :class:`FewBitGELU`, ...).
"""
from .activations import ACTIVATIONS, Activation, activation
from .fewbit import (FewBitActivation, FewBitELU, FewBitGELU, FewBitLeakyReLU, FewBitMish,
                     FewBitReLU, FewBitSELU, FewBitSigmoid, FewBitSiLU, FewBitSoftplus,
                     FewBitTanh, fewbit)
from .packing import pack_bits, packed_nbytes, unpack_bits
from .solver import WEIGHTS, StepTable, solve, table_error
from .tables import fewbit_table

__all__ = ["ACTIVATIONS", "Activation", "activation", "FewBitActivation", "FewBitReLU",
           "FewBitLeakyReLU", "FewBitGELU", "FewBitSiLU", "FewBitSigmoid", "FewBitTanh",
           "FewBitSELU", "FewBitELU", "FewBitSoftplus", "FewBitMish", "fewbit", "pack_bits",
           "unpack_bits", "packed_nbytes", "WEIGHTS", "StepTable", "solve", "table_error",
           "fewbit_table"]
