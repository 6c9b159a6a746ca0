"""The service layer: every use case of the platform, shared by the CLI (and later the API).

Each function takes a ``ServiceContext`` (``services.context``) and typed input, runs in one
transaction, raises ``ShipyardError`` subclasses, and returns views from ``shipyard.schemas.views``.
Import the modules themselves: this package imports nothing, so a command that needs only the
planner does not load the database layer.
"""
