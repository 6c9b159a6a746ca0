"""What each device is doing now: the vendors' counters for accelerators (NVML on NVIDIA,
``rocm-smi`` on AMD, ``hl-smi`` on Gaudi, each absent without its driver) and ``/proc`` for the
host's CPU, memory and disks. A node's agent samples these every few seconds."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
THROTTLE_REASONS = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake",
}
"""NVML's clock throttle reasons that slow a busy GPU (idle and application clocks are not)."""


@dataclass(frozen=True)
class DeviceReading:
    """One device at one moment; None where its vendor reports no such figure."""

    device: str
    """The accelerator's index as a string, or ``cpu`` for the host."""
    utilization: float | None = None
    """Busy fraction 0..1."""
    memory_gib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    clock_mhz: float | None = None
    io_mib_s: float | None = None
    throttle: str | None = None


FIGURES = tuple(f.name for f in dataclasses.fields(DeviceReading) if f.name not in ("device", "throttle"))
"""The numbers a reading holds (what telemetry stores, averages and charts)."""


def query_accelerator_telemetry() -> list[DeviceReading]:
    """Every accelerator of this node that a vendor's tool reports on ([] on a CPU-only node)."""
    return query_nvml_telemetry() or query_rocm_telemetry() or query_gaudi_telemetry()


def query_nvml_telemetry() -> list[DeviceReading]:
    from shipyard.hardware.discovery import nvml

    with nvml() as pynvml:
        if pynvml is None:
            return []
        readings = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
                readings.append(
                    DeviceReading(
                        device=str(i),
                        utilization=pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                        memory_gib=pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
                        power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                        temperature_c=float(
                            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                        ),
                        clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                        throttle=throttle_words(reasons),
                    )
                )
            except pynvml.NVMLError:
                continue  # a GPU that does not answer: the health check reports it
        return readings


def throttle_words(reasons: int) -> str | None:
    """NVML's throttle bitmask in words; None when nothing slows the device."""
    words = [word for bit, word in THROTTLE_REASONS.items() if reasons & bit]
    return ", ".join(words) or None


def query_rocm_telemetry() -> list[DeviceReading]:
    if shutil.which("rocm-smi") is None:
        return []
    command = [
        "rocm-smi",
        "--showuse",
        "--showmemuse",
        "--showpower",
        "--showtemp",
        "--showmeminfo",
        "vram",
        "--json",
    ]
    return parse_rocm_smi(_output(command))


def parse_rocm_smi(text: str) -> list[DeviceReading]:
    """``rocm-smi --json``: one object per ``cardN`` whose keys name the figure and its unit."""
    try:
        cards: dict[str, dict[str, Any]] = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return []

    def figure(card: dict[str, Any], *starts: str) -> float | None:
        for key, value in card.items():
            if key.startswith(starts):
                try:
                    return float(str(value).split()[0])
                except ValueError:
                    return None
        return None

    readings = []
    for name, card in sorted(cards.items()):
        if not name.startswith("card") or not isinstance(card, dict):
            continue
        busy = figure(card, "GPU use (%)")
        used = figure(card, "VRAM Total Used Memory (B)")
        readings.append(
            DeviceReading(
                device=name.removeprefix("card"),
                utilization=None if busy is None else busy / 100,
                memory_gib=None if used is None else used / GIB,
                power_w=figure(
                    card, "Average Graphics Package Power (W)", "Current Socket Graphics Package Power (W)"
                ),
                temperature_c=figure(
                    card, "Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)"
                ),
            )
        )
    return readings


def query_gaudi_telemetry() -> list[DeviceReading]:
    if shutil.which("hl-smi") is None:
        return []
    fields = "index,utilization.aip,memory.used,power.draw,temperature.aip"
    return parse_hl_smi(_output(["hl-smi", f"--query-aip={fields}", "--format=csv,noheader,nounits"]))


def parse_hl_smi(text: str) -> list[DeviceReading]:
    """``hl-smi --query-aip=index,utilization.aip,memory.used,power.draw,temperature.aip`` as
    CSV without header or units (memory in MiB)."""
    readings = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        busy, used, power, temperature = (_number(cell) for cell in cells[1:])
        readings.append(
            DeviceReading(
                device=cells[0],
                utilization=None if busy is None else busy / 100,
                memory_gib=None if used is None else used / 1024,
                power_w=power,
                temperature_c=temperature,
            )
        )
    return readings


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


class HostSampler:
    """The host's CPU busy fraction, memory in use and disk traffic from ``/proc``, each rate over
    the time since the previous sample (the first sample has none)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._previous: tuple[float, int, int, int] | None = None
        """(monotonic time, busy jiffies, all jiffies, sectors read and written)."""

    def sample(self) -> DeviceReading:
        now = time.monotonic()
        busy, total = self._cpu_jiffies()
        sectors = self._disk_sectors()
        utilization = io_mib_s = None
        if self._previous is not None:
            then, busy_then, total_then, sectors_then = self._previous
            if total > total_then:
                utilization = (busy - busy_then) / (total - total_then)
            if now > then:
                io_mib_s = (sectors - sectors_then) * 512 / 2**20 / (now - then)
        self._previous = (now, busy, total, sectors)
        return DeviceReading(
            device="cpu", utilization=utilization, memory_gib=self._memory_used_gib(), io_mib_s=io_mib_s
        )

    def _cpu_jiffies(self) -> tuple[int, int]:
        fields = [int(v) for v in (self.proc / "stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def _memory_used_gib(self) -> float:
        info = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024 if rest.split() else 0
        return (info.get("MemTotal", 0) - info.get("MemAvailable", 0)) / GIB

    def _disk_sectors(self) -> int:
        """Sectors read and written by whole disks (partitions would count twice)."""
        total = 0
        path = self.proc / "diskstats"
        for line in path.read_text().splitlines() if path.exists() else []:
            cells = line.split()
            if (
                len(cells) >= 10
                and not cells[2].startswith(("loop", "ram"))
                and Path(f"/sys/block/{cells[2]}").exists()
            ):
                total += int(cells[5]) + int(cells[9])
        return total
