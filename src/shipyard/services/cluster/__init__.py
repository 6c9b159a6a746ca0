"""The cluster: its nodes and devices, queues and quotas, telemetry, usage, and the simulator."""
