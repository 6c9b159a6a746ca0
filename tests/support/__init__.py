"""Harnesses tests and benchmarks start real services with (never shipped in the package)."""
