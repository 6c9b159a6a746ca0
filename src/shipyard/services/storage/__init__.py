"""Artifact storage: artifacts, datasets, the stores' health, their upkeep and the scrubber that runs it."""
