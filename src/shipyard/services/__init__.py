"""The service layer: every use case of the platform, shared by the CLI (and later the API).

Each function takes a ``ServiceContext`` and typed input, runs in one transaction, raises
``ShipyardError`` subclasses, and returns views from ``shipyard.schemas.views``.
"""

from shipyard.services.context import ServiceContext, open_context

__all__ = ["ServiceContext", "open_context"]
