"""Recovery without a human: the restart policy on real jobs through the CLI, the agent and the
runtime. Faults this machine would not have by itself (a device out of memory, a collective
that never returns) are injected into the runtime through ``$SHIPYARD_FAULTS``; processes and
the agent are killed for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shipyard.daemon.supervisor import is_running
from shipyard.settings import Settings
from tests.builders import write_spec
from tests.conftest import Cli

pytestmark = pytest.mark.integration

QUICK = {"max": 2, "backoff_s": 0.0}


def _train_losses(cli: Cli, job_id: str) -> dict[int, float]:
    """The loss of each step, from the job's metrics file."""
    run_dir = Path(cli.json("jobs", "show", job_id)["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def _done(job: dict[str, Any]) -> bool:
    return job["state"] in ("succeeded", "failed", "cancelled")


def test_out_of_memory_is_recovered_with_the_same_global_batch(cli: Cli, tmp_path: Path) -> None:
    clean = cli.json("jobs", "submit", str(write_spec(tmp_path, "clean")), "--wait")
    # The fault stands in for a GPU this machine lacks: a micro-batch above 2 runs out of memory.
    # The agent that ran the clean job may still be up: the next one starts with the fault.
    _restart_agent_with(cli, SHIPYARD_FAULTS=json.dumps({"attempts": [1], "oom_above_micro_batch": 2}))
    job = cli.json("jobs", "submit", str(write_spec(tmp_path, "oom", restarts=QUICK)), "--wait")
    assert job["state"] == "succeeded", job
    detail = cli.json("jobs", "show", job["id"])
    first, second = detail["attempts"]
    assert (first["exit_reason"], second["exit_reason"]) == ("oom", "completed")
    assert (first["micro_batch_size"], second["micro_batch_size"]) == (4, 2)
    log = cli.run("jobs", "logs", job["id"]).stdout
    assert "16 micro-steps of 2x64" in log  # 8 of 4 before: the same 2,048 tokens per step
    # The same samples in every step: the loss curve is the uninterrupted run's.
    assert _train_losses(cli, job["id"]) == pytest.approx(_train_losses(cli, clean["id"]), rel=1e-4)
    shown = cli.run("jobs", "show", job["id"]).stdout
    assert "micro-batch" in shown and "oom" in shown


def test_a_killed_attempt_restarts_from_the_store_when_its_disk_is_gone(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, training={"steps": 400}, checkpoint={"interval": 4}, restarts={"max": 2, "backoff_s": 3.0}
    )
    # The first attempt is slowed (80 ms a step) so that it is still running when it is killed,
    # however fast the machine; the restart runs at full speed.
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.02})
    job = cli.json("jobs", "submit", str(spec))
    running = cli.wait_for(job["id"], lambda j: j["step"] >= 9)
    # Checkpoints reach the artifact store while the attempt runs, not when it ends.
    stored = _stored_checkpoints(cli, job["id"])
    assert stored, "no checkpoint reached the store while the job ran"
    os.killpg(running["attempts"][0]["pid"], signal.SIGKILL)
    metrics = Path(running["run_dir"]) / "metrics.jsonl"
    with metrics.open("a") as torn:  # as if the kill cut the line being written
        torn.write('{"kind": "train", "st')
    requeued = cli.wait_for(job["id"], lambda j: j["state"] == "queued")
    assert requeued["pending_code"] == "restarting"
    assert (
        "restart 1 of 2 after attempt 1: the training process was killed by SIGKILL (signal 9)"
        in (requeued["pending_reason"])
    )
    shutil.rmtree(Path(requeued["run_dir"]) / "checkpoints")  # as if the node's disk were lost
    done = cli.wait_for(job["id"], _done, timeout=300)
    assert done["state"] == "succeeded" and done["step"] == 400, done
    assert [a["exit_reason"] for a in done["attempts"]] == ["signal", "completed"]
    # The torn line stayed alone on its line: the agent skipped it, the next attempt began anew.
    unreadable = []
    for line in metrics.read_text().splitlines():
        try:
            json.loads(line)
        except ValueError:
            unreadable.append(line)
    assert unreadable == ['{"kind": "train", "st']
    log = cli.run("jobs", "logs", job["id"]).stdout
    resumed = int(log.split("resumed from ")[1].split(" at step ")[1].split()[0])
    assert resumed >= 4  # from the store, not from step 0


def _stored_checkpoints(cli: Cli, job_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not (stored := cli.json("storage", "ls", f"jobs/{job_id}/checkpoint/", "--project", "default")):
        if time.monotonic() > deadline:
            break
        time.sleep(1)  # each look is a CLI process: a second of CPU the job needs
    return stored  # type: ignore[no-any-return]


def test_hangs_are_retried_whatever_their_step_with_the_stacks_of_a_stopped_process_kept(
    cli: Cli, tmp_path: Path
) -> None:
    """A hang is the machine's (a collective whose peer died, a stuck device): retried whatever
    step it hits. The first attempt hangs in step 3; the second is stopped (SIGSTOP), so it runs
    no signal handler: its stacks are read from outside it. The third completes."""
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "hang_at_step": 3})
    # Grace enough for an attempt to start on a loaded 2-core machine.
    restarts = {**QUICK, "startup_grace_s": 15.0, "hang_factor": 3.0}
    spec = write_spec(tmp_path, training={"steps": 60}, checkpoint={"interval": 2}, restarts=restarts)
    job = cli.json("jobs", "submit", str(spec))
    second = cli.wait_for(job["id"], lambda j: len(j["attempts"]) == 2 and j["step"] >= 4, timeout=180)
    os.kill(_training_process(second["attempts"][1]["pid"]), signal.SIGSTOP)
    done = cli.wait_for(job["id"], _done, timeout=240)
    assert done["state"] == "succeeded", done
    assert [a["exit_reason"] for a in done["attempts"]] == ["hang", "hang", "completed"]
    run_dir = Path(done["run_dir"])
    first, stopped = ((run_dir / "stacks" / f"attempt-{n}.txt").read_text() for n in (1, 2))
    assert "before_forward" in first and "faults.py" in first  # where the injected hang waits
    assert "Thread" in stopped and "trainer.py" in stopped  # a stopped process, read as it stood
    log = Path(done["attempts"][1]["log_path"]).read_text()  # `jobs logs` shows the newest attempt's
    assert "attempt 2 hung: every rank's stacks, read from outside" in log
    for hung in done["attempts"][:2]:  # stopped once silent for its limit, never before
        assert 0 < hung["health"]["limit_s"] <= hung["health"]["silent_s"], hung["health"]


def test_the_jobs_own_error_is_retried_when_asked_but_not_twice_at_one_step(cli: Cli, tmp_path: Path) -> None:
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"raise_at_step": 3})  # every attempt fails in step 3
    restarts = {**QUICK, "on": ["error"]}
    spec = write_spec(tmp_path, training={"steps": 8}, checkpoint={"interval": 2}, restarts=restarts)
    done = cli.wait_for(cli.json("jobs", "submit", str(spec))["id"], _done, timeout=180)
    assert done["state"] == "failed"
    assert [a["exit_reason"] for a in done["attempts"]] == ["error", "error"]
    assert "the same failure at the same step (2) as an earlier attempt" in done["message"]
    assert "--resume-from" in done["hint"]


def test_a_new_agent_adopts_the_attempts_that_still_run(cli: Cli, tmp_path: Path) -> None:
    # Slowed (0.2 s a step) so that the attempt still runs when its agent is killed, however fast
    # the machine: a job that ended first would need no new agent to adopt it.
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"slow_rank": 0, "slow_s": 0.05})
    job = cli.json("jobs", "submit", str(write_spec(tmp_path, training={"steps": 40})))
    running = cli.wait_for(job["id"], lambda j: j["step"] >= 3)
    agent_pid = int((cli.home / "agent.lock").read_text().split()[0])
    os.kill(agent_pid, signal.SIGKILL)
    # Looking at the jobs starts a new agent, which adopts the attempt: same process, one attempt.
    done = cli.wait_for(job["id"], _done, timeout=300)
    assert done["state"] == "succeeded", done
    [attempt] = done["attempts"]
    assert attempt["pid"] == running["attempts"][0]["pid"]
    assert int((cli.home / "agent.lock").read_text().split()[0]) != agent_pid
    assert [j["id"] for j in cli.json("jobs", "list")] == [job["id"]]  # nothing duplicated


def test_a_policy_that_never_retries_is_refused_a_pointless_interval_warned(cli: Cli, tmp_path: Path) -> None:
    refused = cli.run(
        "jobs", "submit", str(write_spec(tmp_path, restarts={"max": 0, "on": ["hang"]})), check=False
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "restarts" in refused.stderr and "max is 0" in refused.stderr
    long = cli.run("jobs", "submit", str(write_spec(tmp_path, checkpoint={"interval": 100})), "--json")
    assert "Warning: checkpoint.interval (100) is longer than the run (8 steps)" in long.stderr
    assert json.loads(long.stdout)["warnings"][0].startswith("checkpoint.interval (100)")


def test_a_node_short_of_disk_is_cordoned_and_drained_until_it_is_well(cli: Cli, tmp_path: Path) -> None:
    # Steps enough that it cannot end before a new agent takes over (a restarted agent comes
    # back only once the old one's silence is long enough); it is cancelled at the end.
    job = cli.json("jobs", "submit", str(write_spec(tmp_path, training={"steps": 20000})))
    cli.wait_for(job["id"], lambda j: j["step"] >= 3)
    _restart_agent_with(cli, SHIPYARD_MIN_FREE_DISK_GIB="1e12", SHIPYARD_UNHEALTHY_NODE="drain")
    # More free disk asked for than any disk has: the node is unfit; its job checkpoints, stops
    # and waits, saying why, and nothing starts there.
    waiting = cli.wait_for(job["id"], lambda j: j["pending_code"] == "cordoned", timeout=120)
    assert " is cordoned: disk: " in waiting["pending_reason"]
    assert [a["exit_reason"] for a in waiting["attempts"]] == ["preempted"]
    [node] = cli.json("nodes")
    assert node["problems"] and node["problems"][0].startswith("disk: ")
    assert "cordoned: disk: " in cli.run("nodes").stdout
    # Space freed: the next agent finds the node fit, and the job resumes.
    _restart_agent_with(cli)
    resumed = cli.wait_for(job["id"], lambda j: j["state"] == "running" and len(j["attempts"]) == 2)
    assert cli.json("nodes")[0]["problems"] == []
    cli.run("jobs", "cancel", resumed["id"])
    cli.wait_for(job["id"], _done)


def _restart_agent_with(cli: Cli, **env: str) -> None:
    """Stop the agent (its jobs run on) and set the environment the next one starts with."""
    cli.stop_agent()
    while is_running(Settings(home=cli.home, db_url="")):
        time.sleep(0.2)
    for name in ("SHIPYARD_MIN_FREE_DISK_GIB", "SHIPYARD_UNHEALTHY_NODE"):
        cli.env.pop(name, None)
    cli.env.update(env)


def test_an_adopted_attempt_that_dies_is_recorded_with_its_real_cause(cli: Cli, tmp_path: Path) -> None:
    """Its agent is gone and the new one cannot wait() for it: the attempt's parent did, and left
    how the process ended (SIGKILL, not "lost") where the new agent reads it."""
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"attempts": [1], "slow_rank": 0, "slow_s": 0.05})
    spec = write_spec(tmp_path, training={"steps": 40}, checkpoint={"interval": 2}, restarts=QUICK)
    job = cli.json("jobs", "submit", str(spec))
    running = cli.wait_for(job["id"], lambda j: j["step"] >= 3)
    os.kill(int((cli.home / "agent.lock").read_text().split()[0]), signal.SIGKILL)
    os.kill(_training_process(running["attempts"][0]["pid"]), signal.SIGKILL)  # as the OOM killer would
    done = cli.wait_for(job["id"], _done, timeout=300)
    assert done["state"] == "succeeded", done
    first = done["attempts"][0]
    assert (first["exit_reason"], first["exit_code"]) == ("signal", -9)
    exited = json.loads((Path(done["run_dir"]) / "exit.json").read_text())
    assert exited["parent_pid"] == done["attempts"][1]["pid"]  # each attempt's parent writes its own


def _training_process(parent: int) -> int:
    """The training process of a one-process attempt: the only child of the attempt's parent."""
    [child] = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return int(child)


def test_a_job_whose_record_keeps_raising_is_set_aside_and_the_others_run(cli: Cli, tmp_path: Path) -> None:
    cli.env["SHIPYARD_FAULTS"] = json.dumps({"slow_rank": 0, "slow_s": 0.05})
    damaged = cli.json("jobs", "submit", str(write_spec(tmp_path, "damaged", training={"steps": 400})))
    cli.wait_for(damaged["id"], lambda j: j["step"] >= 2)
    # Its disk damaged: the metrics file the agent reads is a folder now, on every pass.
    metrics = Path(damaged["run_dir"]) / "metrics.jsonl"
    metrics.unlink()
    metrics.mkdir()
    del cli.env["SHIPYARD_FAULTS"]
    other = cli.json("jobs", "submit", str(write_spec(tmp_path, "other")), "--wait")
    assert other["state"] == "succeeded", other
    [attempt] = cli.json("jobs", "show", damaged["id"])["attempts"]
    assert "IsADirectoryError" in attempt["health"]["quarantined"]
    assert "set aside for 600s after 3 passes in a row" in attempt["health"]["quarantined"]
    # Its outcome alone was rolled back each time: no pass failed for it.
    log = (cli.home / "agent.log").read_text()
    assert "recording its outcome failed" in log and "the agent's pass failed" not in log


@pytest.mark.parametrize(
    ("boundary", "attempts"),
    [
        ("claimed", ["completed"]),  # nothing committed: the next agent claims it again
        ("attempt_recorded", ["lost", "completed"]),  # recorded, never started: found gone, retried
        ("engine_accepted", ["completed"]),  # started, its pid not recorded: found by its folder
        ("outcome_recorded", ["completed"]),  # all recorded: adopted
    ],
)
def test_an_agent_killed_at_each_boundary_of_a_launch_loses_no_job_and_starts_none_twice(
    tmp_path: Path, db_url: str, boundary: str, attempts: list[str]
) -> None:
    from shipyard.agent.launching import CRASH_ENV

    cli = Cli(tmp_path / "home")
    cli.env.update({"SHIPYARD_DB_URL": db_url, CRASH_ENV: boundary})
    try:
        job = cli.json("jobs", "submit", str(write_spec(tmp_path, restarts=QUICK)))
        done = cli.wait_for(job["id"], _done, timeout=300)
        assert (cli.home / f".crashed-at-{boundary}").exists()  # the agent did die there
        assert done["state"] == "succeeded", done
        assert [a["exit_reason"] for a in done["attempts"]] == attempts
        assert [j["id"] for j in cli.json("jobs", "list")] == [job["id"]]
        # No training process of the home is left: none was started that no record named.
        run_dir = done["run_dir"].encode()
        assert not [
            proc.name
            for proc in Path("/proc").glob("[0-9]*")
            if run_dir in _cmdline(proc) and b"shipyard.training" in _cmdline(proc)
        ]
    finally:
        cli.stop_agent()


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
