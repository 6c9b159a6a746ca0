"""Trace-driven simulation of the scheduler: the same ``run_cycle``, a virtual clock and a
simulated executor."""
