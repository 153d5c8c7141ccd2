"""Ablations: one script per kernel decision, each with the sources it builds (see its docstring)."""
