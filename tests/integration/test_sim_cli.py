"""`shipyard sim` as other tools call it: JSON fields, policies, traces, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration

GAVEL = Path(__file__).resolve().parents[3] / "shared" / "data" / "scheduling" / "gavel"
THROUGHPUTS = GAVEL / "simulation_throughputs.json"
BASE = ["sim", "run", "--throughputs", str(THROUGHPUTS), "--cluster", "v100=8,p100=8,k80=8"]
CONTRACT = ["avg_jct_h", "p50_jct_h", "p99_jct_h", "makespan_h", "utilization", "jobs_measured",
            "restarts_per_job", "worst_ftf_rho", "policy_solve_ms_p50"]  # fmt: skip

needs_data = pytest.mark.skipif(
    not THROUGHPUTS.exists(), reason="the shared Gavel data is not beside the checkout"
)


@needs_data
@pytest.mark.parametrize(
    ("policy", "mechanism"),
    [("fifo", "shipyard"), ("fifo_perf", "shipyard"), ("gavel_las_perf", "shipyard"),
     ("shortest_remaining_perf", "shipyard"), ("shortest_remaining_fluid", "shipyard"),
     ("gavel_fifo", "gavel"), ("gavel_las_perf", "gavel")],
)  # fmt: skip
def test_sim_run_json_contract(cli: Cli, policy: str, mechanism: str) -> None:
    args = ["--policy", policy, "--workload", "gavel", "--multi-gpu", "--rate", "0.5", "--seed", "0",
            "--mechanism", mechanism]  # fmt: skip
    # Fifteen jobs measured: with thirty, FIFO under Gavel's rounds simulated 1,700 hours (45 s).
    out = json.loads(cli.run(*BASE, *args, "--window", "5:20", "--round-s", "360", "--json").stdout)
    assert [key for key in CONTRACT if key not in out] == []
    assert out["jobs_measured"] == 15 and 0 < out["utilization"] <= 1
    assert out["p50_jct_h"] <= out["p99_jct_h"]


@needs_data
def test_static_jobs_and_the_same_answer_for_the_same_seed(cli: Cli) -> None:
    args = [
        *BASE,
        "--policy",
        "shipyard",  # the default policy's former name, still accepted
        "--multi-gpu",
        "--static-jobs",
        "30",
        "--restart-cost-s",
        "30",
        "--json",
    ]
    first, second = (json.loads(cli.run(*args).stdout) for _ in range(2))
    assert first["jobs_measured"] == 30 and first["makespan_h"] > 0
    assert {k: v for k, v in first.items() if "solve_ms" not in k} == {
        k: v for k, v in second.items() if "solve_ms" not in k
    }


@needs_data
def test_a_gavel_trace_replays(cli: Cli) -> None:
    trace = GAVEL / "traces" / "msr_seed0" / "23dbec.trace"
    args = ["--cluster", "v100=16,p100=16,k80=16", "--trace", str(trace), "--trace-format", "gavel"]
    out = json.loads(cli.run(*BASE[:4], *args, "--policy", "fifo_perf", "--json").stdout)
    assert out["jobs_measured"] > 0


@needs_data
def test_a_run_of_gavels_simulator_replays(cli: Cli) -> None:
    """The JSON ``run_gavel.py --out`` writes: its generated jobs, replayed through Shipyard's."""
    run_file = Path(__file__).resolve().parents[1] / "data" / "gavel-run-fifo-1.0-seed0.json"
    args = ["--trace", str(run_file), "--window", "20:60", "--policy", "fifo_perf", "--json"]
    out = json.loads(cli.run(*BASE, *args).stdout)
    assert out["jobs_measured"] == 40 and out["avg_jct_h"] > 0


def test_sim_policies_lists_the_default_first(cli: Cli) -> None:
    names = json.loads(cli.run("sim", "policies", "--json").stdout)
    assert names[0] == "shortest_remaining_fluid"
    assert {"fifo", "fifo_perf", "gavel_las_perf", "min_makespan", "max_throughput_per_dollar"} <= set(names)


@needs_data
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "v100=8,a100=8", "--rate", "1"], "type 'a100' has no throughputs"),
        (["--cluster", "v100=8", "--policy", "best", "--rate", "1"], "unknown policy 'best'"),
        (["--cluster", "v100=8", "--policy", "gandiva", "--rate", "1"], "policy 'gandiva' has no port"),
        (["--cluster", "v100=8", "--rate", "1", "--mechanism", "slurm"], "--mechanism 'slurm' is not known"),
        (
            ["--cluster", "v100=8", "--policy", "max_min_fairness_perf", "--rate", "1"],
            "Shipyard's counterpart is 'gavel_las_perf'",
        ),
        (
            ["--cluster", "v100=8", "--rate", "1", "--jobs", "100", "--window", "50:150"],
            "--window 50:150 ends past the 100 jobs of the workload",
        ),
        (["--cluster", "v100=eight", "--rate", "1"], "--cluster: 'v100=eight' is not TYPE=NUMBER"),
        (["--cluster", "v100=8", "--rate", "1", "--window", "5:2"], "--window '5:2' is not START:END"),
        (["--cluster", "v100=8"], "needs a positive --rate"),
        (
            ["--cluster", "v100=8", "--policy", "min_total_duration_perf", "--rate", "1"],
            "Shipyard's counterpart is 'gavel_min_makespan'",
        ),
        (["--cluster", "v100=8", "--rate", "1", "--queue-mix", "a=1"], "--queue-mix needs --queues FILE"),
    ],
)
def test_bad_input_names_the_flag(cli: Cli, args: list[str], message: str) -> None:
    done = cli.run("sim", "run", "--throughputs", str(THROUGHPUTS), *args, check=False)
    assert done.returncode == 1 and message in done.stderr.replace("\n", " ")
    assert "Traceback" not in done.stderr


def test_a_malformed_trace_names_its_line(cli: Cli, tmp_path: Path) -> None:
    if not THROUGHPUTS.exists():
        pytest.skip("the shared Gavel data is not beside the checkout")
    trace = tmp_path / "bad.trace"
    trace.write_text("ResNet-18 (batch size 64)\tcmd\t-n\t1\tmany\t0\t1\n")
    done = cli.run(*BASE, "--trace", str(trace), check=False)
    assert done.returncode == 1 and "line 1" in done.stderr


QUEUES = """\
clusterQueues:
  - {name: research, cohort: lab, nominal: {v100: 6, p100: 6, k80: 6}}
  - {name: prod, cohort: lab, nominal: {v100: 2, p100: 2, k80: 2}}
localQueues: {research: research, prod: prod}
"""


@needs_data
def test_queues_and_cohorts_in_a_simulation(cli: Cli, tmp_path: Path) -> None:
    """Quota admission runs in the simulator as in the live agent: with half the jobs each, the
    queue with a quarter of the quota waits longer (it borrows only what the other leaves idle);
    a queue the file lacks, or one that could never hold a gang, is refused by name."""
    queues = tmp_path / "queues.yaml"
    queues.write_text(QUEUES)
    args = [*BASE, "--multi-gpu", "--rate", "0.5", "--window", "10:40", "--queues", str(queues)]
    out = cli.json(*args, "--queue-mix", "research=0.5,prod=0.5")
    by_queue = out["avg_jct_h_by_queue"]
    assert set(by_queue) == {"research", "prod"} and by_queue["prod"] > by_queue["research"]
    assert cli.json(*args)["avg_jct_h_by_queue"] == {}  # one queue: nothing to break down
    done = cli.run(*args, "--queue-mix", "research=0.5,ops=0.5", check=False)
    assert done.returncode == 1 and "no queue 'ops'" in done.stderr and "research" in done.stderr
    queues.write_text(QUEUES.replace("{v100: 2, p100: 2, k80: 2}}", "{v100: 2, p100: 2, k80: 2}, "
                                     "borrowingLimit: {v100: 0, p100: 0, k80: 0}}"))  # fmt: skip
    done = cli.run(*args, "--queue-mix", "research=0.5,prod=0.5", check=False)
    assert done.returncode == 1 and "can never be admitted" in done.stderr and "prod" in done.stderr
