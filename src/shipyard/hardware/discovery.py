"""Device discovery: which accelerators this node has, each mapped to a catalog key.

Each vendor is asked through one small query function. ``VendorQueries`` bundles them so tests can
fake the answer of hardware this machine lacks (an H100 box, an MI250, an M2 Ultra) without the
code ever pretending at run time: the real functions below are what ``discover()`` uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shipyard.hardware.catalog import lookup, match_accelerator_type
from shipyard.hardware.telemetry import DeviceReading, query_accelerator_telemetry

GIB = 1024**3


@dataclass(frozen=True, slots=True, kw_only=True)
class RawDevice:
    """What a vendor query reports about one device, before catalog mapping."""

    vendor: str
    """``nvidia``, ``amd``, ``apple``, ``intel``."""
    index: int
    name: str
    memory_bytes: int
    nvlink_peers: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo:
    model: str
    cores: int
    mhz: float
    flags: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One device of this node, as the executor hands it out."""

    accelerator_type: str
    """Catalog key, or ``unknown`` when the catalog has no row for the reported name."""
    index: int
    name: str
    vendor: str
    memory_gib: float
    peak_bf16_tflops: float
    peak_fp32_tflops: float
    nvlink_peers: tuple[int, ...] = ()
    cores: int = 0
    """CPU cores (only for the ``cpu`` device)."""


@dataclass(frozen=True, slots=True)
class VendorQueries:
    """The seam: one function per vendor API. Each returns [] when its hardware is absent."""

    nvidia: Callable[[], list[RawDevice]] = field(default=lambda: query_nvml())
    torch_devices: Callable[[], list[RawDevice]] = field(default=lambda: query_torch_devices())
    cpu: Callable[[], CpuInfo] = field(default=lambda: query_cpu())
    utilization: Callable[[], dict[int, float]] = field(default=lambda: query_nvml_utilization())
    """Busy fraction (0..1) per accelerator index, where the vendor reports one."""
    health: Callable[[], dict[int, str]] = field(default=lambda: query_nvml_health())
    """Accelerators unfit for work, by index, with why (``hardware.health``)."""
    telemetry: Callable[[], list[DeviceReading]] = field(default=lambda: query_accelerator_telemetry())
    """Each accelerator's utilization, memory, power, temperature, clock and throttling now."""


def discover(queries: VendorQueries | None = None) -> list[Device]:
    """All devices of this node: accelerators first, then the CPU as one ``cpu`` device."""
    queries = queries or VendorQueries()
    raw = queries.nvidia()
    if not raw:
        # torch sees NVIDIA GPUs too; only ask it when NVML did not answer, to avoid doubles.
        raw = queries.torch_devices()
    else:
        raw += [d for d in queries.torch_devices() if d.vendor != "nvidia"]
    devices = [_to_device(d) for d in raw]
    devices.append(cpu_device(queries.cpu()))
    return devices


def _to_device(raw: RawDevice) -> Device:
    memory_gib = raw.memory_bytes / GIB
    key = match_accelerator_type(raw.name, memory_gib)
    spec = lookup(key) if key else None
    return Device(
        accelerator_type=key or "unknown",
        index=raw.index,
        name=raw.name,
        vendor=raw.vendor,
        memory_gib=round(memory_gib, 1),
        # An unknown device gets no peak, so MFU shows as 0 rather than a wrong guess.
        peak_bf16_tflops=spec.bf16_tflops if spec else 0.0,
        peak_fp32_tflops=spec.fp32_tflops if spec else 0.0,
        nvlink_peers=raw.nvlink_peers,
    )


def cpu_device(info: CpuInfo) -> Device:
    """The host CPU as a device, with a peak derived from cores, clock and vector units."""
    ghz = info.mhz / 1000
    return Device(
        accelerator_type="cpu",
        index=0,
        name=info.model,
        vendor="generic",
        memory_gib=round(_host_memory_bytes() / GIB, 1),
        peak_bf16_tflops=float(f"{info.cores * ghz * _bf16_flops_per_cycle(info) / 1000:.4g}"),
        peak_fp32_tflops=float(f"{info.cores * ghz * _fp32_flops_per_cycle(info) / 1000:.4g}"),
        cores=info.cores,
    )


def _fp32_flops_per_cycle(info: CpuInfo) -> int:
    # Two FMA ports, each lane doing a multiply and an add.
    if "avx512f" in info.flags and not _splits_512_bit_ops(info):
        return 2 * 16 * 2
    if "avx2" in info.flags and "fma" in info.flags:
        return 2 * 8 * 2
    return 8


BF16_WITHOUT_UNITS_SLOWDOWN = 10
"""Without bf16 dot-product units (AVX512-BF16, AMX) torch's CPU kernels multiply bf16 matrices
in a fallback that widens each element first: ``F.linear`` in bf16 ran at 2.4-10 GFLOP/s per core
against 51-72 in fp32 (torch 2.13, an AVX2 EPYC at 2.4 GHz, the shapes of the tiny to 12 M
presets), 7-25x slower; a whole llama-12m step took over 13x the fp32 one."""


def _bf16_flops_per_cycle(info: CpuInfo) -> float:
    if "amx_bf16" in info.flags:
        return 1024  # AMX tile unit, per core
    if "avx512_bf16" in info.flags:
        # VDPBF16PS: two bf16 products per fp32 lane
        return 2 * (8 if _splits_512_bit_ops(info) else 16) * 2 * 2
    return _fp32_flops_per_cycle(info) / BF16_WITHOUT_UNITS_SLOWDOWN


def _splits_512_bit_ops(info: CpuInfo) -> bool:
    """AMD's Zen 4 runs AVX-512 on 256-bit units, each 512-bit op in two halves (its software
    optimization guide): no more FLOPs per cycle than AVX2. Server Zen 5, which added VP2INTERSECT,
    has full-width units (mobile Zen 5 splits too, and its flags do not say so). Seen here: a Zen 4
    EPYC ran Shipyard's CPU job at half the peak that counting full 512-bit FMAs gave."""
    return "AMD" in info.model.upper() and "avx512_vp2intersect" not in info.flags


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


# --- real vendor queries ---------------------------------------------------------------------


def query_cpu() -> CpuInfo:
    model, mhz, flags = platform.processor() or platform.machine(), 0.0, frozenset[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value
                elif key == "cpu MHz" and not mhz:
                    mhz = float(value)
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass  # not Linux: model from platform, peak unknown
    if platform.system() == "Darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
    return CpuInfo(model=model, cores=usable_cores(), mhz=mhz, flags=flags)


def usable_cores() -> int:
    """Cores this process may run on (respects cgroup/affinity limits where the OS exposes them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """``pynvml``, initialised for the block; None without the package, a driver or a GPU (not
    an error: just no NVIDIA devices)."""
    if importlib.util.find_spec("pynvml") is None:
        yield None
        return
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def query_nvml() -> list[RawDevice]:
    """NVIDIA GPUs through NVML (``nvidia-ml-py``), with NVLink peers; [] without driver."""
    with nvml() as pynvml:
        if pynvml is None:
            return []
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_ids = [_bus_id(pynvml.nvmlDeviceGetPciInfo(h)) for h in handles]
        devices = []
        for i, handle in enumerate(handles):
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            peers = _nvlink_peers(pynvml, handle, bus_ids)
            devices.append(
                RawDevice(
                    vendor="nvidia",
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_bytes=int(memory),
                    nvlink_peers=peers,
                )
            )
        return devices


def query_nvml_utilization() -> dict[int, float]:
    """Each NVIDIA GPU's busy fraction over NVML's last sample period; {} without driver."""
    with nvml() as pynvml:
        if pynvml is None:
            return {}
        try:
            busy = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                busy[i] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            return busy
        except pynvml.NVMLError:
            return {}  # a GPU that does not report utilization (some MIG setups): unknown, not zero


def query_nvml_health() -> dict[int, str]:
    """NVIDIA GPUs unfit for work, by index, with why: uncorrectable ECC errors since the driver
    loaded, or no answer at all (a GPU that fell off the bus). {} without a driver."""
    with nvml() as pynvml:
        if pynvml is None:
            return {}
        problems: dict[int, str] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceGetUtilizationRates(handle)  # a lost GPU fails here
            except pynvml.NVMLError as exc:
                problems[i] = f"does not answer ({exc})"
                continue
            try:
                errors = pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            except pynvml.NVMLError:
                continue  # no ECC on this GPU (GeForce): nothing to judge
            if errors:
                problems[i] = f"{errors} uncorrectable ECC errors since the driver loaded"
        return problems


def _bus_id(pci: object) -> str:
    bus = getattr(pci, "busId", b"")
    return (bus.decode() if isinstance(bus, bytes) else str(bus)).lower()


def _nvlink_peers(pynvml: object, handle: object, bus_ids: Sequence[str]) -> tuple[int, ...]:
    peers: set[int] = set()
    max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
    for link in range(max_links):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):  # type: ignore[attr-defined]
                continue
            remote = _bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))  # type: ignore[attr-defined]
        except Exception:  # NVMLError_NotSupported on GPUs without NVLink
            break
        if remote in bus_ids:
            peers.add(bus_ids.index(remote))
    return tuple(sorted(peers))


DEVICE_FILES = ("nvidia[0-9]*", "dxg", "nvhost-ctrl-gpu", "kfd", "dri/renderD*", "accel/accel*", "hl[0-9]*")
"""What a GPU or accelerator driver puts in /dev: NVIDIA (WSL 2's GPU, Jetson's), AMD ROCm, Intel
(XPU), Gaudi."""


def _os_shows_a_device(dev: Path = Path("/dev")) -> bool:
    """Whether torch could find a device here: the OS shows one in ``dev``, or this is a Mac (MPS).
    Importing torch to ask takes two seconds, on every command that places a job."""
    return platform.system() == "Darwin" or any(next(dev.glob(p), None) for p in DEVICE_FILES)


def query_torch_devices() -> list[RawDevice]:
    """AMD (ROCm build), Apple MPS, Intel XPU/HPU, as far as an installed torch exposes them."""
    if importlib.util.find_spec("torch") is None or not _os_shows_a_device():
        return []
    import torch

    devices: list[RawDevice] = []
    if torch.cuda.is_available():
        vendor = "amd" if torch.version.hip else "nvidia"
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                RawDevice(vendor=vendor, index=i, name=props.name, memory_bytes=props.total_memory)
            )
    if torch.backends.mps.is_available():
        # Apple silicon shares memory between CPU and GPU: report the unified memory.
        name = _sysctl("machdep.cpu.brand_string") or "Apple silicon"
        devices.append(RawDevice(vendor="apple", index=0, name=name, memory_bytes=_host_memory_bytes()))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for i in range(xpu.device_count()):
            props = xpu.get_device_properties(i)
            devices.append(
                RawDevice(vendor="intel", index=i, name=props.name, memory_bytes=props.total_memory)
            )
    if importlib.util.find_spec("habana_frameworks") is not None:
        import habana_frameworks.torch.hpu as hpu

        for i in range(hpu.device_count()):
            devices.append(RawDevice(vendor="intel", index=i, name=hpu.get_device_name(i), memory_bytes=0))
    return devices


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
