"""The HTTP API: ``create_app(settings)`` serves the service layer under ``/api/v1``."""

from shipyard.api.app import create_app

__all__ = ["create_app"]
