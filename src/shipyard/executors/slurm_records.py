"""What Slurm's own commands print, read into values: ``scontrol --oneliner`` records, host lists,
GRES, node and job states and pending reasons in Shipyard's words (with Slurm's code beside).
The Slurm executor runs the commands, these read their answers (a node's CPU rates are this
machine's: Slurm does not say which CPU a node has)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from shipyard.executors.base import EngineEnding, NodeInventory
from shipyard.hardware.catalog import catalog
from shipyard.hardware.discovery import Device, cpu_device, query_cpu
from shipyard.hardware.emulation import emulated_accelerators

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def oneliner_records(text: str) -> list[dict[str, str]]:
    """Each line of ``scontrol show ... --oneliner`` as its ``Key=Value`` pairs (a value may hold
    spaces, as ``OS=Linux 6.1 #1 SMP`` does: it runs to the next ``Key=``)."""
    records = []
    for line in text.splitlines():
        keys = list(_KEY.finditer(line))
        if not keys:
            continue
        record = {}
        for this, following in zip(keys, [*keys[1:], None], strict=True):
            end = following.start() if following else len(line)
            record[this.group(1)] = line[this.end() : end].strip()
        records.append(record)
    return records


def expand_hostlist(hostlist: str) -> list[str]:
    """``n[1-3,7],gpu[01-02]`` as its host names, in order (Slurm's compressed host lists)."""
    if not hostlist or hostlist in ("(null)", "None"):
        return []
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]*(?:\[[^\]]*\])?[^,\[]*", hostlist):
        if not item:
            continue
        match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", item)
        if match is None:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{width}d}{suffix}")
    return hosts


@dataclass(frozen=True, slots=True)
class Gres:
    """GPUs of one GRES type on a node (``gpu:TYPE:COUNT``; type ``""`` when the site names none)."""

    gres_type: str
    count: int


def parse_gpus(gres: str) -> list[Gres]:
    """The GPU entries of a node's ``Gres=`` (``gpu:h100:4(S:0-1),nic:2`` → one entry)."""
    found = []
    for name, typed, count in re.findall(r"(?:^|,)(\w+):(?:([^:,()]+):)?(\d+)", gres or ""):
        if name == "gpu":
            found.append(Gres(typed or "", int(count)))
    return found


def parse_gres_mapping(text: str) -> dict[str, str]:
    """``a100=a100-80gb,h100=h100-sxm`` (a site's GRES type names → catalog types)."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        gres_type, sep, catalog_type = item.partition("=")
        if not sep or not gres_type or not catalog_type:
            raise ValueError(item)
        mapping[gres_type.strip()] = catalog_type.strip()
    return mapping


# --- node states -------------------------------------------------------------------------------

UNFIT_NODE_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING", "POWERED_DOWN"})
DOWN_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN"})


def node_state(state: str) -> tuple[str, bool]:
    """A node's ``State=`` in lower case (``idle``, ``mixed+drain``) and whether new work may go
    there (not down, drained, failing or unresponsive)."""
    base, *flags = state.rstrip("*~#!%$@^-").split("+")
    fit = base not in DOWN_STATES and not UNFIT_NODE_FLAGS.intersection(flags)
    return state.lower(), fit


# --- job states --------------------------------------------------------------------------------

PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}
)
NODE_FAULT_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
"""Ended because a node failed: the machine's fault, retried from the newest checkpoint."""
ENGINE_ENDINGS: dict[str, EngineEnding] = {
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "PREEMPTED": "preempted",
    "OUT_OF_MEMORY": "out_of_memory",
}
"""Endings Slurm decided, as ``Exited.engine_ended`` names them."""


def exit_code(text: str) -> tuple[int, int | None]:
    """``ExitCode=CODE:SIGNAL`` as (code, signal or None)."""
    code, _, sig = (text or "0:0").partition(":")
    number = int(sig or 0)
    return int(code or 0), number or None


_PENDING_WORDS: Mapping[str, str] = {
    "None": "submitted; Slurm has not considered it yet",
    "Resources": "Slurm waits for nodes with enough free resources",
    "Priority": "Slurm runs jobs of higher priority first",
    "Dependency": "it waits on a Slurm job dependency",
    "BeginTime": "its start time has not come",
    "ReqNodeNotAvail": "a node it needs is not available in Slurm (down, drained or reserved)",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit is longer than its partition allows",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "NodeDown": "a node it needs is down",
    "JobHeldUser": "held by its user in Slurm (scontrol release)",
    "JobHeldAdmin": "held by a Slurm administrator",
    "Reservation": "it waits for its reservation to start",
    "QOSMaxGRESPerUser": "its QOS's limit on GPUs per user is reached",
    "QOSMaxJobsPerUserLimit": "its QOS's limit on jobs per user is reached",
    "QOSGrpGRES": "its QOS's limit on GPUs in use is reached",
    "QOSGrpCpuLimit": "its QOS's limit on CPUs in use is reached",
    "AssocGrpGRES": "its Slurm account's limit on GPUs in use is reached",
    "AssocGrpCpuLimit": "its Slurm account's limit on CPUs in use is reached",
    "AssocMaxJobsLimit": "its Slurm account's limit on running jobs is reached",
    "Licenses": "it waits for licenses",
    "launch failed requeued held": "Slurm could not launch it and holds it",
}


def pending_words(reason: str) -> str:
    """Slurm's pending reason in Shipyard's words, Slurm's code beside it."""
    code = (reason or "None").strip()
    words = _PENDING_WORDS.get(code) or next(
        (w for key, w in _PENDING_WORDS.items() if code.startswith(key) and key != "None"), None
    )
    return f"{words} (Slurm: {code})" if words else f"Slurm holds it in its queue (Slurm: {code})"


def iter_features(features: str) -> Iterator[str]:
    """A node's ``AvailableFeatures`` as names (``(null)`` when it has none)."""
    if features and features != "(null)":
        yield from filter(None, features.split(","))


def node_inventory(
    record: dict[str, str], switches: Mapping[str, str], gres_types: Mapping[str, str]
) -> NodeInventory:
    """A node as ``scontrol show node`` describes it: its GPUs by GRES type mapped onto the
    catalog's (those of unknown types named in a label), its CPU, state, features and switch."""
    name = record["NodeName"]
    state, fit = node_state(record.get("State", "UNKNOWN"))
    labels = {"slurm.state": state, "hostname": record.get("NodeHostName", name)}
    if partitions := record.get("Partitions"):
        labels["slurm.partitions"] = partitions
    for feature in iter_features(record.get("AvailableFeatures", "")):
        key, sep, value = feature.partition("=")  # a feature `rack=r1` is a label as such
        labels[key if sep else f"feature.{feature}"] = value if sep else "true"
    if name in switches:
        labels["switch"] = switches[name]
    devices: list[Device] = []
    unmapped = []
    for gres in parse_gpus(record.get("Gres", "")):
        kind = gres_types.get(gres.gres_type, gres.gres_type)
        if kind not in catalog():
            unmapped.append(f"gpu:{gres.gres_type or '(untyped)'}:{gres.count}")
            continue
        devices += emulated_accelerators(kind, gres.count, first_index=len(devices))
    if unmapped:
        labels["slurm.unmapped_gres"] = " ".join(unmapped)
    cores = int(record.get("CPUTot") or record.get("CPUEfctv") or 1)
    devices.append(_cpu(cores, float(record.get("RealMemory") or 0) / 1024))
    in_use = {"cpu": int(record.get("CPUAlloc") or 0)}
    if reason := record.get("Reason"):
        labels["slurm.reason"] = reason
    return NodeInventory(id=name, devices=tuple(devices), labels=labels, up=fit, in_use=in_use)


@functools.cache
def _cpu(cores: int, memory_gib: float) -> Device:
    """A Slurm node's CPU as a device: its cores and memory from Slurm, its peak rates per core
    as this machine's (Slurm does not say which CPU a node has)."""
    info = query_cpu()
    device = cpu_device(dataclasses.replace(info, cores=cores))
    return dataclasses.replace(device, memory_gib=round(memory_gib, 1))
