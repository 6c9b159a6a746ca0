"""The capacity planner: memory, time, cost and energy of an LLM workload on any accelerator.

Pure: no disk, network, clock or randomness. Callers resolve the catalog and pass specs in.
"""
