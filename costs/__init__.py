"""costs — what the hardware costs: an energy/area model (pJ per MAC, µm²) and FPGA
resources and Fmax measured by synthesizing rtl/ units.
"""
