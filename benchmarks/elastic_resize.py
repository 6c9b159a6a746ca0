"""What a resize of an elastic job costs on this machine, and that it changes no step's loss.

Through the real CLI in a fresh home (the local executor, CPU processes): an elastic job
(``devices: {min: 1, max: 2}``, half the cores per process) runs alone on two processes; a
priority-5 job of one process arrives, so the elastic one shrinks to one and, once that job has
ended, grows back to two. Beside it, the same spec at a fixed two processes. Prints, per resize,
the seconds without a step (from the last step before the stop to the first step after the
restart: the checkpoint, the exit, the new processes, the reload), and the largest relative
difference of a step's loss from the fixed-size run's.

    .venv/bin/python benchmarks/elastic_resize.py [--steps 240] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

SHIPYARD = [sys.executable, "-m", "shipyard.cli.main"]
STDLIB = Path(os.__file__).parent


def spec(name: str, resources: dict[str, Any], steps: int, priority: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"preset": "llama-tiny"},
        "data": {"paths": [str(STDLIB / "json" / "*.py")], "tokenizer": {"vocab_size": 512}},
        "training": {
            "steps": steps,
            "global_batch_tokens": 2048,
            "micro_batch_size": 4,
            "seq_len": 64,
            "eval_interval": 0,
            "log_interval": 1,
        },
        "resources": {"accelerator": "cpu", **resources},
        "checkpoint": {"interval": 0},
        "priority": priority,
    }


class Home:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "SHIPYARD_HOME": str(root / "home"),
            "SHIPYARD_AGENT_POLL_S": "0.2",
            "SHIPYARD_AGENT_IDLE_EXIT_S": "5",
            "SHIPYARD_POLICY": "priority",
            "SHIPYARD_ROUND_S": "1",
            "SHIPYARD_RESIZE_COST_S": "1",
        }

    def cli(self, *args: str) -> Any:
        done = subprocess.run([*SHIPYARD, *args, "--json"], capture_output=True, text=True, env=self.env)
        if done.returncode != 0:
            raise SystemExit(f"shipyard {' '.join(args)} failed:\n{done.stderr}")
        return json.loads(done.stdout)

    def submit(self, document: dict[str, Any]) -> str:
        path = self.root / f"{document['name']}.yaml"
        path.write_text(yaml.safe_dump(document))
        return str(self.cli("jobs", "submit", str(path))["id"])

    def wait(self, job_id: str, until: Any, timeout: float = 900) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.cli("jobs", "show", job_id)
            if until(job):
                return job  # type: ignore[no-any-return]
            time.sleep(1.0)
        raise SystemExit(f"job {job_id} did not get there in {timeout:.0f} s")


def records(job: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (Path(job["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def pauses(job: dict[str, Any]) -> list[float]:
    """Seconds from the last step before each restart to the first step after it."""
    found, last_step_at, resumed = [], None, False
    for record in records(job):
        if record["kind"] == "resume":
            resumed = True
        elif record["kind"] == "train":
            if resumed and last_step_at is not None:
                found.append(record["time"] - last_step_at)
            resumed, last_step_at = False, record["time"]
    return found


def losses(job: dict[str, Any]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(job) if r["kind"] == "train"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    half = max(1, len(os.sched_getaffinity(0)) // 2)
    running = lambda j: j["state"] == "running" and (j["step"] or 0) >= 5  # noqa: E731
    ended = lambda j: j["state"] in ("succeeded", "failed", "cancelled")  # noqa: E731
    with tempfile.TemporaryDirectory() as root:
        home = Home(Path(root))
        # Rank 0 sleeps 0.1 s a step (timing only) so the other job arrives mid-run on any machine.
        home.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1, 2, 3, 4, 5], "slow_rank": 0, "slow_s": 0.1})
        elastic = home.submit(
            spec("grows", {"devices": {"min": 1, "max": 2}, "cpus_per_device": half}, args.steps)
        )
        home.wait(elastic, running)
        urgent = home.submit(spec("urgent", {"devices": 1, "cpus_per_device": half}, 20, priority=5))
        home.wait(urgent, ended)
        grown = home.wait(elastic, ended)
        home.env.pop("SHIPYARD_FAULTS")
        fixed = home.wait(
            home.submit(spec("fixed", {"devices": 2, "cpus_per_device": half}, args.steps)), ended
        )
        resize_s, ours, reference = pauses(grown), losses(grown), losses(fixed)
        worst = max(abs(ours[s] - reference[s]) / abs(reference[s]) for s in ours if s in reference)
        result = {
            "cores": len(os.sched_getaffinity(0)),
            "attempts": [(a["world_size"], a["exit_reason"]) for a in grown["attempts"]],
            "resize_s": resize_s,
            "median_resize_s": statistics.median(resize_s) if resize_s else None,
            "max_relative_loss_difference": worst,
        }
        if args.json:
            print(json.dumps(result, indent=2))
            return
        print(f"attempts (processes, ending): {result['attempts']}")
        print(f"resize pauses: {', '.join(f'{s:.1f} s' for s in resize_s)}")
        print(f"largest relative difference of a step's loss from the fixed-size run: {worst:.2e}")


if __name__ == "__main__":
    main()
