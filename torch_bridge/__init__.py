"""torch_bridge — PyTorch drop-ins that run models on emulated PAM hardware.

What belongs here: PAM matmul/linear/conv/attention, PA softmax, layer norm, loss
and optimizers with exact or approximate derivatives, narrow mantissas, model
conversion and memory-saving activations — all numerics taken from emu.
"""
