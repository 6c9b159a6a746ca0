"""The training runtime. Executors launch it by module name (``python -m shipyard.training``);
nothing else in Shipyard imports it, so the platform runs without torch."""
