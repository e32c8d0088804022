"""workloads — the training workloads shared by the simulations (sim) and the cost model
(costs): small reference models (:mod:`workloads.models`) and the offline data sets and
pretrained model (:mod:`workloads.data`).  Plain PyTorch and NumPy; it imports no other
pamsim package, so every package above it may use it.
"""
