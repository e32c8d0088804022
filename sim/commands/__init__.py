"""Subcommands of ``pamsim``: one module each, discovered by sim.cli.

A module defines ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as a default.  Every option value is checked at
parse time by a ``type=`` validator of :mod:`sim.cli` (``format_arg``,
``formats_arg``, ``int_in``/``positive_int``/``nonneg_int``, ``float_in``,
``output_file``, ``output_dir``), so a bad one gives argparse's one-line error
before any work; ``run`` checks combinations of options first and reports them
with :func:`sim.cli.fail`.
"""
