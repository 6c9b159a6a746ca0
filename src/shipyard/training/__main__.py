"""Entry point: ``python -m shipyard.training RUN_DIR`` (under torchrun for several processes).

Reads ``RUN_DIR/launch.json``, trains, and reports the outcome in ``RUN_DIR/result.json``. Exit
code 0 when the run completed or was stopped cleanly (checkpointed), 1 when it failed.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from shipyard.errors import ShipyardError
from shipyard.schemas.launch import RESULT_FILE, AttemptResult, LaunchPlan, write_json_atomic


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m shipyard.training RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    plan = LaunchPlan.read(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    try:
        from shipyard.training.trainer import Trainer

        result = Trainer(plan).run()
    except ShipyardError as exc:
        print(f"Error: {exc.message}" + (f"\nHint: {exc.hint}" if exc.hint else ""), flush=True)
        result = AttemptResult(status="failed", message=exc.message, hint=exc.hint)
    except Exception as exc:
        traceback.print_exc()
        result = AttemptResult(status="failed", message=f"{type(exc).__name__}: {exc}")
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


if __name__ == "__main__":
    sys.exit(main())
