"""Parity engine: paths, metrics, tolerance policy, runner, CLI."""
