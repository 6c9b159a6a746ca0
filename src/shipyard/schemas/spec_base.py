"""What every section of the job spec shares: strict, frozen, bounded fields, each described by
its docstring."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shipyard.domain.text import DNS_LABEL, has_control_character

API_VERSION = "shipyard/v1"
SPEC_HINT = "`shipyard spec` lists every field; `shipyard spec example pretrain` writes a starter"
"""Where every hint about the spec points: the reference generated from these models."""

MAX_STEPS = 10**9
"""Optimizer steps of one job: far beyond any real run, well inside a 64-bit counter."""
MAX_TOKENS = 10**15
"""A quadrillion tokens: 60 times Llama 3's 15 T."""
INT32 = 2**31 - 1
MAX_PATH = 4096
"""Linux's PATH_MAX."""

Steps = Annotated[int, Field(ge=0, le=MAX_STEPS)]


def _no_control_characters(value: str) -> str:
    if has_control_character(value):
        raise ValueError("holds a control character (an escape, a newline, ...)")
    return value


FieldName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_no_control_characters)]
PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_no_control_characters)]
Label = Annotated[str, Field(pattern=DNS_LABEL)]


class Section(BaseModel):
    # strict: a YAML `true` is no step count and "8" is no batch size; numbers are finite.
    # Each field's docstring is its description: `shipyard spec` prints them.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )
