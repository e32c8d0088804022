"""Benchmark case groups for ``pamsim bench``: one module per part of pamsim."""
