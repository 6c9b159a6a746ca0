"""Entry point: ``python -m shipyard.training RUN_DIR`` (under torchrun for several processes).

Reads ``RUN_DIR/launch.json``, trains, and reports the outcome in ``RUN_DIR/result.json``. Exit
code 0 when the run completed or was stopped cleanly (checkpointed), 1 when it failed.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Literal

from shipyard.durable import write_json_atomic
from shipyard.errors import ShipyardError
from shipyard.schemas.launch import RESULT_FILE, AttemptResult, LaunchPlan
from shipyard.training.heartbeat import Pulse


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shipyard.training RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    plan = LaunchPlan.read(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    # The agent sends SIGUSR1 to a hung attempt before it stops it: every thread's stack goes
    # into the log, which is how the hang is found (a collective, a data read, a deadlock).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Alive from the first second: importing torch alone took 40 s on a loaded machine, which a
    # heartbeat only from the trainer would have counted as a hang.
    pulse = Pulse(run_dir, int(os.environ.get("RANK", "0")), step=0)
    pulse.keep_alive()
    try:
        from shipyard.training.trainer import Trainer

        result = Trainer(plan, started_pulse=pulse).run()
    except ShipyardError as exc:
        print(f"Error: {exc.message}" + (f"\nHint: {exc.hint}" if exc.hint else ""), flush=True)
        result = AttemptResult(status="failed", message=exc.message, hint=exc.hint)
    except Exception as exc:
        traceback.print_exc()
        result = AttemptResult(
            status="failed", failure=machine_failure(exc), message=f"{type(exc).__name__}: {exc}"
        )
    if is_main:
        write_json_atomic(run_dir / RESULT_FILE, result.model_dump(mode="json"))
    code = 1 if result.status == "failed" else 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Everything is on disk (files are closed after each write): skip the C++ teardown of the
        # process group, whose background threads can abort a finished run at exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


_COLLECTIVE_WORDS = ("nccl", "gloo", "processgroup", "connection closed by peer", "connection reset by peer")
_OUT_OF_MEMORY_WORDS = ("out of memory", "can't allocate memory")


def machine_failure(exc: BaseException) -> Literal["oom", "collective"] | None:
    """Whether an exception is the machine's (out of memory, a collective that failed) rather
    than the job's own, which a retry would meet again."""
    import torch

    text = str(exc).lower()
    if isinstance(exc, torch.OutOfMemoryError) or any(w in text for w in _OUT_OF_MEMORY_WORDS):
        return "oom"
    if isinstance(exc, torch.distributed.DistError) or any(w in text for w in _COLLECTIVE_WORDS):
        return "collective"
    return None


if __name__ == "__main__":
    sys.exit(main())
