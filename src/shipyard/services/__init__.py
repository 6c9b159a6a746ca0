"""The service layer: every use case of the platform, shared by the CLI, the API and the agent.

Grouped by use case: ``jobs`` (submit, show, cancel, series, quickstart), ``models`` (versions,
lineage, base models), ``storage`` (artifacts, datasets, the stores' health, upkeep and the
scrubber that runs it in the background), ``accounts`` (users, tokens, roles, the audit log),
``estimates`` (the planner asked about jobs, measurements, calibration), ``cluster`` (nodes,
devices, queues, telemetry, usage, the simulator), and ``caches`` (process-wide memory of what
never changes: submitted jobs, verified tokens). ``context`` is what every use case takes.

Each function takes a ``ServiceContext`` (``services.context``) and typed input, runs in one
transaction, raises ``ShipyardError`` subclasses, and returns views from ``shipyard.schemas.views``.
Import the modules themselves: the packages import nothing, so a command that needs only the
planner does not load the database layer.
"""
