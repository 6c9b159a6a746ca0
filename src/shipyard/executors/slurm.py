"""Run attempts through a Slurm cluster a team already has: Slurm owns its nodes, places each
allocation and starts its ranks; Shipyard admits (quotas, fair share, policy, type choice).

The inventory is Slurm's own (``scontrol show node``): nodes, GPUs by GRES type (mapped onto the
catalog's types), CPUs, memory, features, switches and state. An admitted attempt becomes one
``sbatch`` allocation, named ``shipyard-<job>.<attempt>`` so that an agent that died before
recording the job id finds it by name; its batch script ``srun``s the ranks with the runtime's
distributed environment derived from ``SLURM_*``. Run folders live on a filesystem every node
mounts (the Shipyard home, or its ``runs`` folder, on NFS, Lustre, GPFS or CephFS): the ranks write
metrics, logs and checkpoints there directly, and the agent reads them as on one machine.

Recovery is Shipyard's: allocations are submitted ``--no-requeue``, and what Slurm ended
(``NODE_FAIL``, ``PREEMPTED``, ``TIMEOUT``, ``OUT_OF_MEMORY``) becomes a new attempt from the newest
checkpoint, each with its own record, reason and retry budget.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from shipyard.errors import DependencyMissing, ExecutorError, LaunchFailed
from shipyard.executors.base import (
    AttemptHandle,
    AttemptStatus,
    Exited,
    NodeInventory,
    NodeLost,
    Placement,
    Request,
    Running,
    StoreAccess,
    Synced,
    Vanished,
    Waiting,
    feasible_on,
    units_on,
)
from shipyard.executors.local import TORCH_DEVICE, read_log_file
from shipyard.executors.slurm_batch import (
    ENDED_MARK,
    LIMIT_SIGNAL,
    SlurmQueue,
    batch_script,
    parse_queues,
)
from shipyard.executors.slurm_records import (
    ENGINE_ENDINGS,
    NODE_FAULT_STATES,
    PENDING_STATES,
    RUNNING_STATES,
    exit_code,
    expand_hostlist,
    node_inventory,
    oneliner_records,
    parse_gres_mapping,
    pending_words,
)
from shipyard.hardware.catalog import catalog
from shipyard.scheduling.status import Status, unplaceable
from shipyard.schemas.launch import LAUNCH_FILE
from shipyard.settings import Settings

HANDLE_PREFIX = "slurm:"
NAME_PREFIX = "shipyard-"
COMMAND_TIMEOUT_S = 30.0
INVENTORY_TTL_S = 1.0
"""How long one read of Slurm's nodes serves: a pass reads them once, not per attempt."""
TIME_MARGIN = 1.5
"""An allocation's time limit over the planner's estimate of its attempt (plus ``TIME_SLACK_MIN``)."""
TIME_SLACK_MIN = 10.0


class SlurmExecutor:
    """The ``Executor`` of a Slurm cluster (``SHIPYARD_EXECUTOR=slurm``), driven from a machine
    with Slurm's client commands (a login node)."""

    shares_run_folders = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            self.gres_types = parse_gres_mapping(settings.slurm_gres_types)
        except ValueError as exc:
            raise ExecutorError(
                f"SHIPYARD_SLURM_GRES_TYPES entry {exc} is not GRES_TYPE=CATALOG_TYPE",
                hint="e.g. SHIPYARD_SLURM_GRES_TYPES='a100=a100-80gb,h100=h100-sxm'",
            ) from exc
        if unknown := sorted(set(self.gres_types.values()) - set(catalog())):
            raise ExecutorError(
                f"SHIPYARD_SLURM_GRES_TYPES names {', '.join(unknown)}, not in the catalog",
                hint="map each GRES type onto a type `shipyard plan catalog` lists",
            )
        self.queues = parse_queues(settings.slurm_queues)
        self._read: tuple[float, list[NodeInventory]] = (-INVENTORY_TTL_S, [])

    # --- Slurm's commands ---------------------------------------------------------------------

    def _slurm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command; a clear error where Slurm is missing or its controller does not
        answer (Slurm's commands retry for long without one)."""
        try:
            done = subprocess.run(
                list(args),
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise DependencyMissing(
                f"the Slurm executor needs Slurm's commands ({args[0]} is not on PATH)",
                hint="run Shipyard on a login node of the cluster, or install slurm-client",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise ExecutorError(
                f"Slurm did not answer `{' '.join(args[:3])}` within {COMMAND_TIMEOUT_S:g}s",
                hint="check that slurmctld runs (`scontrol ping`) and SLURM_CONF names its slurm.conf",
            ) from exc
        if check and done.returncode != 0:
            raise ExecutorError(
                f"`{' '.join(args[:3])}` failed: {done.stderr.strip() or done.stdout.strip()}",
                hint="check the cluster with `scontrol ping` and `sinfo`",
            )
        return done

    # --- inventory ----------------------------------------------------------------------------

    def known_nodes(self) -> list[NodeInventory]:
        read_at, nodes = self._read
        if time.monotonic() - read_at < INVENTORY_TTL_S:
            return nodes
        records = oneliner_records(self._slurm("scontrol", "show", "node", "--oneliner").stdout)
        switches = self._switches
        nodes = [
            node_inventory(record, switches, self.gres_types) for record in records if "NodeName" in record
        ]
        self._read = (time.monotonic(), nodes)
        return nodes

    def nodes(self) -> list[NodeInventory]:
        return [node for node in self.known_nodes() if node.up]

    @functools.cached_property
    def _switches(self) -> dict[str, str]:
        """Each node's leaf switch, where the site has a ``topology.conf`` (read once: a site
        rewires rarely, and the agent is restarted with Slurm's new configuration)."""
        done = self._slurm("scontrol", "show", "topology", check=False)
        leaf: dict[str, str] = {}
        for record in oneliner_records(done.stdout if done.returncode == 0 else ""):
            if record.get("Level", "0") == "0" and "SwitchName" in record:
                for host in expand_hostlist(record.get("Nodes", "")):
                    leaf[host] = record["SwitchName"]
        return leaf

    def check_feasible(self, request: Request) -> Status | None:
        known = self.known_nodes()
        if not known:
            return unplaceable("the Slurm cluster has no nodes", transient=False)
        unfit = feasible_on(known, request, "the Slurm cluster has no nodes")
        unmapped = sorted(
            {n.labels["slurm.unmapped_gres"] for n in known if "slurm.unmapped_gres" in n.labels}
        )
        if unfit is not None and unmapped:
            hint = (
                f"; Slurm nodes have GPUs of GRES types the catalog does not know ({', '.join(unmapped)}): "
                "map them with SHIPYARD_SLURM_GRES_TYPES=GRES_TYPE=CATALOG_TYPE"
            )
            return unplaceable(unfit.message + hint, transient=False)
        return unfit

    # --- placement ----------------------------------------------------------------------------

    def place(self, request: Request, on: Collection[str] | None = None) -> Placement | Status:
        """The nodes the scheduler chose (``on``), or any fit ones, where they have the type; Slurm
        then places the allocation itself (and picks its devices through GRES)."""
        up = {node.id: node for node in self.nodes()}
        reasons: list[str] = []
        for accelerator_type in request.accelerator_types:
            fits = []
            for name in sorted(on) if on is not None else sorted(up):
                if name not in up:
                    reasons.append(f"node {name} is not fit for work in Slurm")
                    continue
                units, have = units_on(up[name], accelerator_type, request)
                if have < units:
                    reasons.append(f"{name}: {accelerator_type} has {have}, needs {units}")
                else:
                    fits.append(up[name])
            if len(fits) >= request.nodes:
                return self._placement(fits[: request.nodes], accelerator_type, request)
        return unplaceable("; ".join(reasons) or "no Slurm node is fit for work", transient=True)

    def _placement(
        self, nodes: Sequence[NodeInventory], accelerator_type: str, request: Request
    ) -> Placement:
        first = nodes[0]
        cores = first.cpu.cores
        if accelerator_type == "cpu":
            threads = request.threads_per_process(cores)
            bf16 = first.cpu.peak_bf16_tflops / cores * threads
            fp32 = first.cpu.peak_fp32_tflops / cores * threads
            torch_device = "cpu"
        else:
            spec = next(d for d in first.accelerators if d.accelerator_type == accelerator_type)
            threads = request.cpus_per_device or max(1, cores // max(1, len(first.accelerators)))
            bf16, fp32 = spec.peak_bf16_tflops, spec.peak_fp32_tflops
            emulated = self.settings.slurm_emulated_gpus
            torch_device = "cpu" if emulated else TORCH_DEVICE.get(spec.vendor, "cuda")
        return Placement(
            node=first.id,
            peers=tuple(node.id for node in nodes[1:]),
            accelerator_type=accelerator_type,
            torch_device=torch_device,  # type: ignore[arg-type]
            device_ids=(),  # Slurm picks each node's devices through GRES
            core_ids=(),
            threads_per_process=threads,
            world_size=request.devices * len(nodes),
            peak_tflops_bf16=bf16,
            peak_tflops_fp32=fp32,
        )

    # --- attempts -----------------------------------------------------------------------------

    def expected_handle(self, placement: Placement, run_dir: Path) -> AttemptHandle:
        """The allocation's name: Slurm's job id is known only once ``sbatch`` answers."""
        return AttemptHandle(nodes=placement.nodes, handle=f"{HANDLE_PREFIX}{_job_name(run_dir)}")

    def launch(
        self, placement: Placement, run_dir: Path, log_path: Path, store: StoreAccess | None = None
    ) -> AttemptHandle:
        del store  # the ranks read and write the run folder on the shared filesystem
        plan = json.loads((run_dir / LAUNCH_FILE).read_text())
        log_path.parent.mkdir(parents=True, exist_ok=True)
        script = run_dir / f"slurm-attempt-{plan['attempt']}.sh"
        script.write_text(batch_script(placement, run_dir, plan["attempt"]))
        options = self.sbatch_options(placement, run_dir, log_path, plan)
        done = self._slurm("sbatch", "--parsable", *options, str(script), check=False)
        if done.returncode != 0:
            raise _refused(done.stderr.strip() or done.stdout.strip())
        job_id = done.stdout.strip().split(";")[0]
        return AttemptHandle(nodes=placement.nodes, handle=f"{HANDLE_PREFIX}{job_id}")

    def sbatch_options(
        self, placement: Placement, run_dir: Path, log_path: Path, plan: dict[str, object]
    ) -> list[str]:
        """The allocation Slurm is asked for: nodes, tasks, CPUs, GPUs by GRES type, memory, the
        queue's partition/account/QoS, a time limit and the warning before it."""
        nodes = {node.id: node for node in self.known_nodes()}
        first = nodes.get(placement.node)
        per_node = placement.world_size // len(placement.nodes)
        options = [
            f"--job-name={_job_name(run_dir)}",
            f"--nodes={len(placement.nodes)}",
            f"--ntasks-per-node={per_node}",
            f"--cpus-per-task={placement.threads_per_process}",
            f"--chdir={run_dir}",
            f"--output={log_path}",
            "--open-mode=append",
            "--no-requeue",
            "--export=ALL",
        ]
        if limit := self.time_limit_min(plan):
            grace = max(30, math.ceil(self.settings.cancel_grace_s))
            options += [f"--time={limit}", f"--signal=B:{LIMIT_SIGNAL}@{grace}"]
        if placement.accelerator_type != "cpu":
            options.append(f"--gres=gpu:{self._gres_type(placement.accelerator_type)}:{per_node}")
        if first is not None and first.cpu.memory_gib > 0:
            # A share of the node's memory as large as its share of the CPUs: Slurm would give
            # an allocation that names none the whole node's, blocking every other job there.
            share = per_node * placement.threads_per_process / first.cpu.cores
            options.append(f"--mem={max(512, int(first.cpu.memory_gib * 1024 * min(1.0, share)))}M")
        spec = plan["spec"]
        assert isinstance(spec, dict)
        queue = self.queues.get(str(spec.get("queue", "default"))) or self.queues.get("*") or SlurmQueue()
        options += [f"--partition={queue.partition}"] * bool(queue.partition)
        options += [f"--account={queue.account}"] * bool(queue.account)
        options += [f"--qos={queue.qos}"] * bool(queue.qos)
        return options

    def time_limit_min(self, plan: dict[str, object]) -> int:
        """The allocation's limit in minutes: the site's where it fixes one, else the planner's
        estimate with margin; 0 without an estimate (the partition's own limit holds)."""
        if self.settings.slurm_time_limit_min is not None:
            return max(1, math.ceil(self.settings.slurm_time_limit_min))
        expected = plan.get("expected_s")
        if not isinstance(expected, int | float):
            return 0
        return math.ceil(expected / 60 * TIME_MARGIN + TIME_SLACK_MIN)

    def _gres_type(self, accelerator_type: str) -> str:
        """The site's GRES type name of a catalog type (its own name where none is mapped)."""
        return next((g for g, c in self.gres_types.items() if c == accelerator_type), accelerator_type)

    def runs(self, handle: AttemptHandle) -> bool:
        return handle.handle.startswith(HANDLE_PREFIX)

    def _job_id(self, handle: AttemptHandle) -> str | None:
        """Slurm's id of the attempt's allocation; looked up by name for a handle recorded before
        ``sbatch`` answered (None: Slurm has no such allocation)."""
        value = handle.handle.removeprefix(HANDLE_PREFIX)
        if not value.startswith(NAME_PREFIX):
            return value
        found = self._slurm("squeue", "--noheader", f"--name={value}", "--format=%i", check=False)
        ids = found.stdout.split()
        return ids[-1] if found.returncode == 0 and ids else None

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        job_id = self._job_id(handle)
        if job_id is None:
            return Vanished()
        record = self._job_record(job_id)
        if record is None:
            return Vanished()
        state = record.get("JobState", "").split()[0] if record.get("JobState") else ""
        nodes = tuple(expand_hostlist(record.get("NodeList", ""))) or handle.nodes
        found = AttemptHandle(nodes=nodes, handle=f"{HANDLE_PREFIX}{job_id}")
        if state in PENDING_STATES:
            return Waiting(pending_words(record.get("Reason", "None")))
        if state in RUNNING_STATES:
            return Running(found if found != handle else None)
        if state in NODE_FAULT_STATES:
            down = tuple(n.id for n in self.known_nodes() if n.id in nodes and not n.up)
            return NodeLost(down or nodes)
        code, sig = exit_code(record.get("ExitCode", "0:0"))
        if state == "CANCELLED" and not expand_hostlist(record.get("NodeList", "")):
            return Exited(code, sig, engine_ended="withdrawn")  # cancelled before it ever ran
        ended = ENGINE_ENDINGS.get(state)
        if self._warned(record):
            ended = "time_limit"
        return Exited(code, sig, engine_ended=ended)

    def _warned(self, record: dict[str, str]) -> bool:
        """Whether the batch script noted Slurm's warning of the time limit."""
        work = record.get("WorkDir")
        name = record.get("JobName", "")
        attempt = name.rpartition(".")[2]
        return bool(work and attempt.isdigit() and (Path(work) / ENDED_MARK.format(attempt=attempt)).exists())

    def _job_record(self, job_id: str) -> dict[str, str] | None:
        """Slurm's record of the allocation: live from the controller, else from accounting
        (``sacct``) once the controller has forgotten it (``MinJobAge``); None where neither has it."""
        done = self._slurm("scontrol", "show", "job", job_id, "--oneliner", check=False)
        if done.returncode == 0 and (records := oneliner_records(done.stdout)):
            return records[0]
        found = self._slurm(
            "sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
            "--format=State,ExitCode,NodeList,WorkDir,JobName", check=False,
        )  # fmt: skip
        lines = found.stdout.strip().splitlines() if found.returncode == 0 else []
        if not lines:
            return None
        state, code, nodelist, work, name = (lines[0].split("|") + [""] * 5)[:5]
        return {
            "JobState": state.split()[0],
            "ExitCode": code,
            "NodeList": nodelist,
            "WorkDir": work,
            "JobName": name,
        }

    def stop(self, handle: AttemptHandle, *, force: bool = False) -> None:
        """SIGTERM to every rank (they checkpoint and exit, and the batch script with them); with
        ``force``, the allocation is cancelled (Slurm kills what is left)."""
        job_id = self._job_id(handle)
        if job_id is None:
            return
        if force:
            self._slurm("scancel", job_id, check=False)
            return
        # The ranks' steps only: SIGTERM to the batch step itself (``--full``) makes Slurm cancel
        # the whole allocation at once, killing the ranks before they checkpoint.
        record = self._job_record(job_id) or {}
        if record.get("JobState", "").split(" ")[0] in PENDING_STATES:  # nothing to checkpoint yet
            self._slurm("scancel", job_id, check=False)  # (a signal to it is accepted and lost)
            return
        done = self._slurm("scancel", "--signal=TERM", job_id, check=False)
        if done.returncode != 0 and "altered" in done.stderr:  # starting: no checkpoint yet either
            self._slurm("scancel", job_id, check=False)

    def dump_stacks(self, handle: AttemptHandle) -> str | None:
        """The ranks write their own stacks into the log (SIGUSR1 through Slurm)."""
        if (job_id := self._job_id(handle)) is not None:
            self._slurm("scancel", "--signal=USR1", job_id, check=False)
        return None

    def sync(self, handle: AttemptHandle, run_dir: Path) -> Synced:
        del handle, run_dir  # the ranks write into the shared run folder itself
        return Synced()

    def release(self, handle: AttemptHandle) -> None:
        """End the allocation where its script still runs after its ranks ended."""
        if (job_id := self._job_id(handle)) is not None:
            self._slurm("scancel", job_id, check=False)

    def read_log(self, node: str | None, log_path: Path, offset: int, limit: int | None = None) -> bytes:
        del node  # Slurm writes every rank's lines, labelled, into the attempt's log
        return read_log_file(log_path, offset, limit)


def _job_name(run_dir: Path) -> str:
    plan = json.loads((run_dir / LAUNCH_FILE).read_text())
    return f"{NAME_PREFIX}{plan['job_id']}.{plan['attempt']}"


def _refused(message: str) -> LaunchFailed:
    """``sbatch``'s refusal as a launch failure: transient where the controller was busy or away."""
    transient = any(
        words in message.lower()
        for words in ("unable to contact", "socket timed out", "try again", "slurmctld", "temporarily")
    )
    fix = "check the queue's partition, account and QoS (SHIPYARD_SLURM_QUEUES) against `sinfo`"
    return LaunchFailed(
        f"sbatch refused the allocation: {message}", transient=transient, hint=None if transient else fix
    )
