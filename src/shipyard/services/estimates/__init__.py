"""Estimates: the planner asked about a job (``estimates``), the planner's own commands
(``planning``), what jobs measured (``measurements``), calibration, and plan gaps."""
