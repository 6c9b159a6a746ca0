"""Typed input models shared by services, CLI and the training runtime (``jobspec``, ``presets``,
...), imported from their modules: ``shipyard plan`` reads the presets without paying for the job
spec's models."""
