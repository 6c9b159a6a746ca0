"""The accelerator catalog: one row per accelerator type, shipped as data (``catalog.yaml``).

A user file of the same shape extends it: a row with a known key overrides only the fields it
names (your own price, power or network); a row with a new key adds a device and must be whole.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
)

from shipyard.errors import InvalidSpec

Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]

HOURS_OF_AMORTIZATION = 3 * 365 * 24
BUILT_IN = "the built-in catalog"
PRICE_FIELDS = ("price_usd", "price_usd_per_h")
"""A purchase price becomes an hourly one over three years of use."""


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PeakTflops(_Row):
    """Dense peak per device by precision; ``None`` where the device has no such unit."""

    fp64: PositiveFloat | None = None
    fp32: PositiveFloat | None = None
    tf32: PositiveFloat | None = None
    bf16: PositiveFloat | None = None
    fp16: PositiveFloat | None = None
    fp8: PositiveFloat | None = None
    int8: PositiveFloat | None = None


class Link(_Row):
    link: str
    """``nvlink-4``, ``pcie-gen4``, ``infinity-fabric``, ``gaudi-roce``, ``none``."""
    gb_per_s: float = Field(ge=0)
    """Per direction, per device."""


class AcceleratorSpec(_Row):
    key: str
    vendor: str
    name: str
    architecture: str
    """Generation (``hopper``, ``ampere``, ``cdna3``...): the planner's efficiencies are per generation."""
    match: tuple[str, ...] = ()
    tflops: PeakTflops
    memory_gib: PositiveFloat
    usable_memory_fraction: float = Field(default=1.0, gt=0, le=1)
    """Unified-memory machines let the GPU wire only part of the memory."""
    memory_bandwidth_gb_per_s: PositiveFloat
    interconnect: Link
    host_link: str = "-"
    devices_per_node: PositiveInt = 8
    network_gbit_per_s: PositiveFloat
    """Default scale-out bandwidth per device between nodes."""
    tdp_w: PositiveFloat
    power_limit_w: PositiveFloat | None = None
    """The board power limit a cluster runs this type at, where below its TDP (``nvidia-smi -pl``;
    Meta's H100s at 500 W, Llama 2's production A100s at 350 W): the clocks fall with it."""
    gemm_efficiency: float | None = Field(default=None, gt=0, le=2)
    """The share of the peak above that this device's matrix multiplies sustain, where it was
    measured (a host's CPU: its clock under load is not the nominal one); else the planner's
    figure for the generation."""
    op_overhead_us: float = Field(default=0.0, ge=0)
    """Host time per tensor operation (dispatch and autograd bookkeeping), as ``hardware.probe``
    measures it. A CPU pays it in series with its math; a GPU's host pays it while the device runs
    the kernels queued before. 0 where not measured: a CPU's plan then counts no dispatch, a GPU's
    takes the planner's reference host."""
    price_usd: PositiveFloat | None = None
    price_usd_per_h: PositiveFloat | None = None
    price_source: str | None = None
    """Where the prices come from (a price list, a report, a marketplace listing)."""
    price_as_of: Annotated[str, Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")] | None = None
    """When they were taken, ``YYYY-MM-DD``: prices move, a rental price a year old may be half off."""
    price_from: str = BUILT_IN
    """Whose prices they are: the built-in catalog's, or the hardware file that set them."""
    source: str

    @field_validator("price_as_of", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """YAML reads an unquoted ``2026-11-30`` as a date: kept as the text it was."""
        return value.isoformat() if hasattr(value, "isoformat") else value

    @property
    def board_w(self) -> float:
        """The most power a device draws: its TDP, or the lower limit it runs at."""
        return min(self.tdp_w, self.power_limit_w or self.tdp_w)

    @property
    def bf16_tflops(self) -> float:
        """Dense peak for 16-bit matrix math (fp16 where the device has no bf16, as on Volta)."""
        return self.tflops.bf16 or self.tflops.fp16 or 0.0

    @property
    def fp32_tflops(self) -> float:
        return self.tflops.fp32 or 0.0

    @property
    def usable_memory_gib(self) -> float:
        return self.memory_gib * self.usable_memory_fraction

    def peak_tflops(self, precision: Precision) -> float | None:
        return getattr(self.tflops, precision)  # type: ignore[no-any-return]

    @property
    def price_basis(self) -> str:
        """The price the planner costs with, and what it rests on, in a line."""
        hourly = self.hourly_usd
        if hourly is None:
            return f"{self.key}: no price (set price_usd_per_h in a hardware file)"
        if self.price_usd_per_h is not None:
            what = f"${hourly:.3g}/h rental"
        else:
            what = f"${self.price_usd:,.0f} purchase over 3 years = ${hourly:.3f}/h"
        whose = "built-in catalog" if self.price_from == BUILT_IN else f"your hardware file {self.price_from}"
        dated = f"as of {self.price_as_of}" if self.price_as_of else "date not given"
        where = "; ".join(part for part in (self.price_source, dated, whose) if part)
        return f"{self.key}: {what} ({where})"

    def price_dict(self) -> dict[str, Any]:
        """The price and its provenance, as the planner's JSON gives them."""
        return {
            "usd_per_h": self.hourly_usd,
            "kind": None if self.hourly_usd is None else "rental" if self.price_usd_per_h else "amortized",
            "source": self.price_source,
            "as_of": self.price_as_of,
            "from": self.price_from,
            "basis": self.price_basis,
        }

    @property
    def hourly_usd(self) -> float | None:
        """The rental price, else the purchase price amortized; ``None`` when neither is known."""
        if self.price_usd_per_h is not None:
            return self.price_usd_per_h
        if self.price_usd is not None:
            return self.price_usd / HOURS_OF_AMORTIZATION
        return None


Catalog = Mapping[str, AcceleratorSpec]

# libyaml parses the catalog ~10x faster than pure Python; `shipyard plan` answers in well under a second.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def catalog() -> dict[str, AcceleratorSpec]:
    """Every known accelerator type by key, in the file's (matching) order."""
    text = resources.files("shipyard.hardware").joinpath("catalog.yaml").read_text()
    return _parse_rows(yaml.load(text, Loader=_Loader), base={}, origin=BUILT_IN)


def load_catalog(user_file: Path | None, base: Catalog | None = None) -> dict[str, AcceleratorSpec]:
    """``base`` (the built-in catalog by default), extended and overridden by ``user_file``."""
    base = catalog() if base is None else base
    if user_file is None:
        return dict(base)
    try:
        rows = yaml.load(user_file.read_text(), Loader=_Loader)
    except OSError as exc:
        raise InvalidSpec(
            f"cannot read hardware file {user_file}: {exc.strerror}", hint="check the path"
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidSpec(f"hardware file {user_file} is not valid YAML: {exc}") from None
    if not isinstance(rows, list):
        raise InvalidSpec(
            f"hardware file {user_file} must hold a list of rows",
            hint="write rows like `- key: h100-sxm` followed by the fields to set, e.g. price_usd_per_h: 1.9",
        )
    return _parse_rows(rows, base=base, origin=str(user_file))


def _parse_rows(
    rows: list[Any], *, base: Mapping[str, AcceleratorSpec], origin: str
) -> dict[str, AcceleratorSpec]:
    merged = dict(base)
    for index, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or not isinstance(row.get("key"), str):
            raise InvalidSpec(
                f"{origin}: row {index} has no `key`", hint="start every row with `- key: NAME`"
            )
        key = row["key"]
        known = merged.get(key)
        fields = _deep_merge(known.model_dump(), row) if known else row
        if origin != BUILT_IN:  # whose price it is comes from where the row was read, never the row
            fields = {**fields, "price_from": known.price_from if known else origin}
            if any(name in row for name in PRICE_FIELDS):  # the built-in source and date are not its own
                fields |= {"price_from": origin, **{n: row.get(n) for n in ("price_source", "price_as_of")}}
        try:
            merged[key] = AcceleratorSpec.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise InvalidSpec(
                f"{origin}: row {key!r}: {problems}",
                hint="a new accelerator type needs every field of a built-in row "
                "(see `shipyard plan catalog --json`)",
            ) from None
    return merged


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for name, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(name), dict):
            out[name] = _deep_merge(out[name], value)
        else:
            out[name] = value
    return out


def lookup(key: str, known: Catalog | None = None) -> AcceleratorSpec:
    """The catalog row for ``key``; an unknown key names the closest match and lists the valid ones."""
    rows = catalog() if known is None else known
    try:
        return rows[key]
    except KeyError:
        raise InvalidSpec(f"unknown accelerator type {key!r}", hint=unknown_key_hint(key, rows)) from None


def unknown_key_hint(key: str, rows: Catalog) -> str:
    wanted = key.lower()
    closest = [k for k in rows if k.startswith(wanted)] or difflib.get_close_matches(
        wanted, list(rows), n=1, cutoff=0.4
    )
    guess = f"did you mean {closest[0]!r}? " if closest else ""
    return f"{guess}known accelerator types: {', '.join(rows)}"


def match_accelerator_type(device_name: str, memory_gib: float | None = None) -> str | None:
    """Map a name reported by a vendor query (``NVIDIA H100 80GB HBM3``) to a catalog key.

    Variants that differ only by memory (A100 40/80 GB, V100 16/32 GB) are told apart by name when
    the name says so and otherwise by the reported memory.
    """
    name = device_name.lower()
    for spec in catalog().values():
        if any(pattern in name for pattern in spec.match):
            return _by_memory(spec, memory_gib)
    return None


def _by_memory(spec: AcceleratorSpec, memory_gib: float | None) -> str:
    family = {"a100-80gb": "a100-40gb", "v100-32gb": "v100-16gb"}
    smaller = family.get(spec.key)
    # Reported memory is a little under the nominal size (ECC, driver reserve).
    if smaller is not None and memory_gib is not None and memory_gib <= catalog()[smaller].memory_gib * 1.05:
        return smaller
    return spec.key
