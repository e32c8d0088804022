"""Subcommands of ``pamsim``: one module each, discovered by sim.cli.

A module defines ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as a default.  Format-valued options use
:func:`sim.cli.format_arg` so bad names give argparse's clear error.
"""
