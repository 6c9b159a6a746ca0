"""A throwaway single-node Slurm controller for benchmarks that compare Shipyard with Slurm.

Needs the Debian ``slurm-wlm`` package (``apt-get install slurm-wlm``: slurmctld, sbatch and
munge) and root to start munge. Only the controller runs: jobs submitted ``--hold`` are
accepted, stored and queued, which is what a submission benchmark measures.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

INSTALL = "apt-get install -y slurm-wlm (as root)"

CONFIG = """ClusterName=bench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={port}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmctldLogFile={root}/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MaxJobCount=100000
ReturnToService=2
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=batch Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why Slurm cannot run here, or None."""
    absent = [tool for tool in ("slurmctld", "sbatch", "munged") if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed: {INSTALL}"
    if os.geteuid() != 0:
        return "starting munge and slurmctld needs root"
    return None


def _ensure_munge() -> None:
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    Path("/run/munge").mkdir(exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", shutil.which("munged") or "munged"], check=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def controller() -> Iterator[dict[str, str]]:
    """A fresh slurmctld with empty state; yields the environment that points sbatch at it."""
    _ensure_munge()
    root = Path(tempfile.mkdtemp(prefix="slurm-bench-"))
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    config = root / "slurm.conf"
    config.write_text(
        CONFIG.format(host=socket.gethostname(), port=_free_port(), root=root, cpus=os.cpu_count() or 1)
    )
    env = {**os.environ, "SLURM_CONF": str(config)}
    daemon = subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while (
            subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.find("UP")
            < 0
        ):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"slurmctld did not start; see {root / 'slurmctld.log'}")
            time.sleep(0.2)
        yield env
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
