"""rtl — Amaranth HDL units of piecewise-affine arithmetic, parameterised by emu.Format.

What belongs here: ``amaranth.lib.wiring.Component`` designs (PAM multiplier, PA
divider, IEEE adder and multiplier, pipelined PAM MAC, dot-product arrays) whose
outputs equal emu's operations bit for bit, and the Verilog generation for FPGAs.
"""
