"""torch_bridge.memory — activations that keep less for the backward pass.

Few-bit backward (Novikov et al., ICML 2023): an optimal piecewise-constant
derivative (:func:`solve`, eqs. 3-9) whose interval index is saved bit-packed.
"""
from .activations import ACTIVATIONS, Activation, activation
from .packing import pack_bits, packed_nbytes, unpack_bits
from .solver import WEIGHTS, StepTable, solve, table_error
from .tables import fewbit_table

__all__ = ["ACTIVATIONS", "Activation", "activation", "pack_bits", "unpack_bits",
           "packed_nbytes", "WEIGHTS", "StepTable", "solve", "table_error", "fewbit_table"]
