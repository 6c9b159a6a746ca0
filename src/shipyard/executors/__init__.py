"""Executors: where attempts run. This issue ships the local one (subprocess / torchrun)."""

from shipyard.executors.base import Executor, Placement, Unplaceable
from shipyard.executors.local import LocalExecutor

__all__ = ["Executor", "LocalExecutor", "Placement", "Unplaceable"]
