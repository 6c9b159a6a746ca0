"""The scheduler: pure policy code. A snapshot of jobs, nodes and throughputs goes in; an
allocation and the leases of the next round come out. No clock, file, network or unseeded
randomness: the live daemon and the simulator call the same ``Cycle``."""
