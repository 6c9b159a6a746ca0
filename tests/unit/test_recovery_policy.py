"""The restart policy's arithmetic: hangs and stragglers from heartbeats, the micro-batch after
an out-of-memory, and the warnings a submission gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.agent.recovery import Silence, progress, smaller_micro_batch
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.launch import Heartbeat
from shipyard.services.jobs.submission_checks import recovery_warnings
from tests.builders import spec_dict

START = 1_000_000.0


def beat(rank: int, at: float, step: int = 10, step_s: float = 0.5, compute_s: float = 0.4) -> Heartbeat:
    return Heartbeat(
        rank=rank, step=step, phase="step", at=at, median_step_s=step_s, median_compute_s=compute_s
    )


def watched(looks: list[tuple[float, list[Heartbeat]]], since: float = 0.0) -> float:
    """The silence a watcher counts after looking at these heartbeats at these (monotonic) times."""
    silence = Silence(since=since)
    return [silence.observe(beats, at) for at, beats in looks][-1]


def test_an_attempt_is_hung_after_the_larger_of_k_median_steps_and_the_startup_grace() -> None:
    spec = validate_job_spec(spec_dict(restarts={"hang_factor": 10.0, "startup_grace_s": 3.0}))
    beats = [beat(0, START + 20), beat(1, START + 19)]
    assert progress(beats, 4.9, spec).hung is False  # 10 × 0.5 s = 5 s: not yet
    late = progress(beats, 5.1, spec)
    assert late.hung and late.limit_s == 5.0 and late.step == 10
    # Slow steps: the limit is ten of them, not the grace.
    assert progress([beat(0, START + 20, step_s=60.0)], 500, spec).hung is False
    # No heartbeat yet (the model loads): the grace.
    assert progress([], 2.9, spec).hung is False
    assert progress([], 3.1, spec).hung is True


def test_silence_is_counted_from_the_quietest_ranks_last_change_on_the_watchers_own_clock() -> None:
    first = [beat(0, START + 1, step=1), beat(1, START + 1, step=1)]
    moved = [beat(0, START + 2, step=2), first[1]]  # rank 0 steps on; rank 1 says nothing more
    assert watched([(10.0, first), (12.0, moved), (20.0, moved)]) == 10.0  # rank 1, since 10.0
    # No heartbeat yet: since the watching began.
    assert watched([(5.0, []), (8.0, [])], since=5.0) == 3.0
    # The wall clock jumps an hour ahead, then back: what the ranks wrote jumps with it, but a
    # heartbeat that changes is life, and one that does not is silence, whatever time it names.
    ahead = [beat(0, START + 3600 + 2, step=2)]
    behind = [beat(0, START - 600, step=3)]
    assert watched([(0.0, first[:1]), (1.0, ahead), (2.0, behind), (3.0, behind)]) == 1.0


def test_a_starting_attempt_is_hung_only_once_a_rank_falls_silent() -> None:
    """While ranks start (importing torch, tokenizing) each says every 2 s that it is alive: a
    long setup is no hang, but one rank stopped is, while the other waits for it beating."""
    spec = validate_job_spec(spec_dict(restarts={"startup_grace_s": 15.0}))
    beating = [(float(t), [Heartbeat(rank=r, step=0, phase="setup", at=START + t) for r in (0, 1)])
               for t in range(0, 60, 2)]  # fmt: skip
    assert progress(beating[-1][1], watched(beating), spec).hung is False  # a minute in: starting
    rank_1_stops = [
        (t, [beats[0], Heartbeat(rank=1, step=0, phase="setup", at=START + min(t, 40))])
        for t, beats in beating
    ]
    assert progress(rank_1_stops[-1][1], watched(rank_1_stops), spec).hung is True  # silent 18 s


def test_a_rank_computing_half_again_as_long_as_the_median_is_a_straggler() -> None:
    spec = validate_job_spec(spec_dict())
    beats = [beat(r, START + 1, compute_s=0.4) for r in range(3)] + [beat(3, START + 1, compute_s=0.9)]
    seen = progress(beats, 1.0, spec)
    assert seen.stragglers == [{"rank": 3, "ratio": 2.25}]
    assert seen.compute_s == {"0": 0.4, "1": 0.4, "2": 0.4, "3": 0.9}
    assert progress(beats[:3], 1.0, spec).stragglers == []


@pytest.mark.parametrize(("micro", "smaller"), [(8, 4), (6, 3), (3, 1), (9, 3), (1, None)])
def test_an_out_of_memory_halves_the_micro_batch_to_a_divisor(micro: int, smaller: int | None) -> None:
    # A divisor of the micro-batch keeps the global batch a whole number of micro-batches.
    assert smaller_micro_batch(micro) == smaller


def test_a_grace_shorter_than_a_planned_step_and_an_interval_past_the_end_are_warned_of() -> None:
    spec = validate_job_spec(spec_dict(restarts={"startup_grace_s": 5.0}, checkpoint={"interval": 20}))
    first, second = recovery_warnings(spec, planned_step_s=30.0)
    assert first.startswith("checkpoint.interval (20) is longer than the run (8 steps)")
    assert second.startswith("restarts.startup_grace_s (5s) is shorter than one step as planned (30s)")
    assert recovery_warnings(validate_job_spec(spec_dict()), planned_step_s=0.1) == ()


def test_a_starting_rank_beats_by_itself_until_its_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from shipyard.training import heartbeat

    monkeypatch.setattr(heartbeat, "STARTING_BEAT_S", 0.05)
    pulse = heartbeat.Pulse(tmp_path, rank=0, step=0)
    pulse.keep_alive()
    first = Heartbeat.model_validate_json(pulse.path.read_bytes())
    time.sleep(0.3)  # the main thread busy elsewhere (an import, a tokenizer): the thread beats
    later = Heartbeat.model_validate_json(pulse.path.read_bytes())
    assert later.phase == "setup" and later.at > first.at
    pulse.stepped(1, step_s=1.0, compute_s=0.8)
    stepped = Heartbeat.model_validate_json(pulse.path.read_bytes())
    time.sleep(0.3)  # once it trains, only steps beat
    assert Heartbeat.model_validate_json(pulse.path.read_bytes()) == stepped


def test_an_attempts_parent_writes_how_its_command_ended_and_ends_the_same_way(tmp_path: Path) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from shipyard.schemas.launch import EXIT_FILE, ExitRecord
    from shipyard.training import parent

    assert parent.EXIT_FILE == EXIT_FILE
    under_parent = [
        sys.executable,
        "-m",
        "shipyard.training.parent",
        str(tmp_path),
        "--",
        sys.executable,
        "-c",
    ]
    for command, code in (("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 9)", -9)):
        done = subprocess.run([*under_parent, command], check=False)
        assert done.returncode == code  # as the command ended, killed by its signal included
        record = ExitRecord.model_validate(json.loads((tmp_path / EXIT_FILE).read_text()))
        assert record.exit_code == code
        assert record.signal == ("SIGKILL" if code == -9 else None)
    # It ignores what the agent asks of the command itself: the command checkpoints and stops.
    stops = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(60)"
    waiting = subprocess.Popen([*under_parent, stops], start_new_session=True)
    time.sleep(1.0)
    os.killpg(waiting.pid, signal.SIGTERM)
    assert waiting.wait(timeout=30) == 0


def test_an_agent_of_this_host_that_ended_is_known_dead_without_waiting_for_silence() -> None:
    """The server starts a new agent at once when the last one to schedule was of this host and
    its process is gone or a zombie; an agent that runs, or one of another host, is waited out."""
    import os
    import signal
    import subprocess
    import sys

    from shipyard.services.jobs.jobs import _ended_here

    host = os.uname().nodename
    assert not _ended_here(f"{host}:{os.getpid()}")  # alive
    assert not _ended_here(f"elsewhere:{os.getpid()}")  # another host: only silence tells
    assert not _ended_here("not-an-agent-id")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert _ended_here(f"{host}:{ended.pid}")
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(zombie.pid, signal.SIGKILL)
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
    try:
        assert _ended_here(f"{host}:{zombie.pid}")
    finally:
        zombie.wait()
