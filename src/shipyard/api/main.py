"""The app uvicorn serves: settings from the environment (``shipyard server`` sets them)."""

from shipyard.api.app import create_app

app = create_app()
