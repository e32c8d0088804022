"""torch_bridge.memory — activations that keep less for the backward pass.

* Few-bit backward (Novikov et al., ICML 2023): the forward is the native
  activation; backward multiplies by an optimal piecewise-constant derivative whose
  interval index is saved bit-packed, 1-8 bits per element (:func:`fewbit`,
  :class:`FewBitGELU`, ...; tables from :func:`solve`, eqs. 3-9).
* Inverted activations (Novikov & Oseledets): save the output and a 1-bit branch
  mask, compute f'(f⁻¹(y)) in backward (:func:`inverted`, :class:`InvGELU`, ...).
* PA activations: piecewise-affine GELU/SiLU whose backward from a segment index is
  exact (:func:`pa_activation`, :class:`PAGELU`, :class:`PASiLU`).
* :func:`convert_activations` swaps a model's activation modules in place.

A config of None (``bits=None``, ``convert_activations(model)``) is the native
behaviour.  The numbers these layers reach are in docs/memory.md.
"""
from .activations import ACTIVATIONS, Activation, activation
from .convert import convert_activations
from .fewbit import (FewBitActivation, FewBitELU, FewBitGELU, FewBitLeakyReLU, FewBitMish,
                     FewBitReLU, FewBitSELU, FewBitSigmoid, FewBitSiLU, FewBitSoftplus,
                     FewBitTanh, fewbit)
from .inverted import (INVERTIBLE, InvGELU, InvMish, InvSiLU, InvertedActivation, inverted,
                       inverter)
from .pa import PA_ACTIVATIONS, PAActivation, PAGELU, PASiLU, PATable, fit_pa, pa_activation, pa_table
from .packing import pack_bits, packed_nbytes, unpack_bits
from .solver import WEIGHTS, StepTable, solve, table_error
from .tables import fewbit_table

__all__ = ["ACTIVATIONS", "Activation", "activation", "convert_activations",
           "FewBitActivation", "FewBitReLU", "FewBitLeakyReLU", "FewBitGELU", "FewBitSiLU",
           "FewBitSigmoid", "FewBitTanh", "FewBitSELU", "FewBitELU", "FewBitSoftplus",
           "FewBitMish", "fewbit", "INVERTIBLE", "InvertedActivation", "InvGELU", "InvSiLU",
           "InvMish", "inverted", "inverter", "PA_ACTIVATIONS", "PAActivation", "PAGELU",
           "PASiLU", "PATable", "fit_pa", "pa_activation", "pa_table", "pack_bits",
           "unpack_bits", "packed_nbytes", "WEIGHTS", "StepTable", "solve", "table_error",
           "fewbit_table"]
