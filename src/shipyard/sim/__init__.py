"""Trace-driven simulation of the scheduler: the same ``Cycle``, a virtual clock and a
simulated executor."""
