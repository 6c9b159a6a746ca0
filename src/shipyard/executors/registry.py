"""Which executor runs the attempts: a name from the settings (``SHIPYARD_EXECUTOR``) and how to
make it. An engine joins by adding its name here; nothing in ``services`` matches strings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shipyard.errors import InvalidSpec
from shipyard.executors.base import Executor
from shipyard.hardware import VendorQueries, discover
from shipyard.hardware.probe import measure_host
from shipyard.settings import Settings


@dataclass(frozen=True, slots=True)
class Engine:
    make: Callable[[Settings, VendorQueries | None], Executor]
    shared_store: bool
    """Whether its attempts run on other machines, so that a relaunch elsewhere resumes only
    from an artifact store every node reads."""
    about: str


def _local(settings: Settings, queries: VendorQueries | None) -> Executor:
    from shipyard.executors.local import LocalExecutor

    # Discovery may import torch or NVML: only pay for it in commands that place work.
    return LocalExecutor(lambda: discover(queries), host=lambda: measure_host(settings.cache_dir))


def _ray(settings: Settings, queries: VendorQueries | None) -> Executor:
    from shipyard.executors.ray_executor import RayExecutor

    del queries  # each node discovers its own devices as it joins
    return RayExecutor(settings.ray_address)


def _slurm(settings: Settings, queries: VendorQueries | None) -> Executor:
    from shipyard.executors.slurm import SlurmExecutor

    del queries  # Slurm says what each node has
    return SlurmExecutor(settings)


ENGINES: dict[str, Engine] = {
    "local": Engine(_local, shared_store=False, about="this machine"),
    "ray": Engine(_ray, shared_store=True, about="a Ray cluster"),
    # Its run folders are on a filesystem every node mounts: a relaunch reads them as here.
    "slurm": Engine(_slurm, shared_store=False, about="a Slurm cluster, from its login node"),
}


def engine_named(name: str) -> Engine:
    if name not in ENGINES:
        known = ", ".join(f"{key} ({engine.about})" for key, engine in ENGINES.items())
        raise InvalidSpec(f"unknown executor {name!r}", hint=f"set SHIPYARD_EXECUTOR to one of: {known}")
    return ENGINES[name]
