"""The ``shipyard`` command: thin commands over the service layer."""
