"""Models: versions and their stages, lineage and comparison, base models and where a model comes from."""
