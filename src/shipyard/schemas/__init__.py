"""Typed input models shared by services, CLI and the training runtime."""

from shipyard.schemas.jobspec import JobSpec, parse_job_spec
from shipyard.schemas.presets import PRESETS, ModelArch

__all__ = ["PRESETS", "JobSpec", "ModelArch", "parse_job_spec"]
