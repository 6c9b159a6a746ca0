"""Shipyard: train and fine-tune LLMs on your own heterogeneous accelerators."""

__version__ = "0.1.0"
