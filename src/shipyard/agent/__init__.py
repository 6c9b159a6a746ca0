"""The agent: the reconcile loop that makes the cluster what the database asks for, between the
daemon that runs it and the services it uses.

- ``passes``: one pass (``tick``): watch the running attempts, schedule, launch; quarantine;
- ``scheduler``: the pass's snapshot of queued and running jobs and its scheduling round (and the
  queues' status read from the same snapshot);
- ``launching``: an attempt's launch plan, recorded before the engine is asked, then started;
- ``outputs``: checkpoints and exports recorded, committed to the store, published;
- ``recovery``: what a failed attempt's cause calls for (retry, with what, or give up);
- ``telemetry``: this machine's health and the pass's own figures.

Nothing in ``services`` imports it (an import contract keeps it so).
"""

from shipyard.agent.passes import Pass, tick

__all__ = ["Pass", "tick"]
