"""``shipyard sim run|policies``: the scheduler on traces, with a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shipyard.cli._output import JsonOpt, console, err_console, table
from shipyard.scheduling.policies import DEFAULT_POLICY, POLICIES
from shipyard.services.cluster import simulation

sub_app = typer.Typer(help="Simulate the scheduler on generated workloads or traces.", no_args_is_help=True)


@sub_app.command("run")
def run(
    throughputs: Annotated[
        Path, typer.Option(help="Gavel-format throughput JSON (steps/s per job type and type).")
    ],
    cluster: Annotated[str, typer.Option(help="Devices per accelerator type, e.g. v100=36,p100=36,k80=36.")],
    policy: Annotated[
        str, typer.Option(help="Allocation policy (`shipyard sim policies`).")
    ] = DEFAULT_POLICY,
    gpus_per_node: Annotated[int, typer.Option(help="Devices per node.")] = 4,
    nodes_per_rack: Annotated[
        int, typer.Option(help="Nodes per rack (0: racks unknown); a gang over racks runs slower still.")
    ] = 0,
    placement: Annotated[
        str, typer.Option(help="Placer: topology (fewest racks, then nodes) or pack (fewest nodes).")
    ] = "topology",
    workload: Annotated[str, typer.Option(help="Generated workload: gavel.")] = "gavel",
    multi_gpu: Annotated[bool, typer.Option("--multi-gpu", help="Generate gangs of 1-8 devices.")] = False,
    rate: Annotated[float | None, typer.Option(help="Jobs per hour (Poisson arrivals).")] = None,
    static_jobs: Annotated[
        int | None, typer.Option(help="This many jobs, all at t=0 (makespan runs).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Jobs to generate (default: the window's end + 2,000, else 1,000).")
    ] = None,
    trace: Annotated[Path | None, typer.Option(help="Replay a trace instead of generating jobs.")] = None,
    trace_format: Annotated[
        str, typer.Option(help="gavel (Gavel's TSV, or a run's JSON), philly, sia or alibaba.")
    ] = "gavel",
    seed: Annotated[int, typer.Option(help="Seed of the workload and of randomized policies.")] = 0,
    window: Annotated[str | None, typer.Option(help="Measure jobs START:END (arrival order).")] = None,
    round_s: Annotated[float, typer.Option("--round-s", help="Round length in seconds.")] = 360.0,
    restart_cost_s: Annotated[
        float, typer.Option("--restart-cost-s", help="Seconds lost per restart.")
    ] = 0.0,
    prices: Annotated[
        str | None, typer.Option(help="Dollars per device-hour, e.g. v100=2.48,k80=0.45.")
    ] = None,
    spread_slowdown: Annotated[
        bool,
        typer.Option(
            help="Gangs spread over nodes run at the unconsolidated throughput (Gavel's simulator: off)."
        ),
    ] = True,
    mechanism: Annotated[
        str,
        typer.Option(
            help="Round mechanism: shipyard, or gavel (re-solve at most every 1,920 s, rank by time "
            "since the last solve, a round ends at its last finish: Gavel's simulator)."
        ),
    ] = "shipyard",
    queues: Annotated[
        Path | None,
        typer.Option(help="Quotas, cohorts and borrowing: a queue file as `shipyard queues config` writes."),
    ] = None,
    queue_mix: Annotated[
        str | None, typer.Option(help="Share of the jobs in each local queue, e.g. research=0.7,prod=0.3.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run one simulation and report JCT, makespan, utilization, restarts, fairness, cost. The
    same scheduling cycle as the live agent's: memory fit, quota admission, the policy, placement."""
    request = simulation.SimRequest(
        throughputs=throughputs,
        cluster=cluster,
        devices_per_node=gpus_per_node,
        nodes_per_rack=nodes_per_rack,
        placement=placement,
        policy=policy,
        workload=workload,
        multi_gpu=multi_gpu,
        rate_per_h=rate,
        static_jobs=static_jobs,
        jobs=jobs,
        trace=trace,
        trace_format=trace_format,
        seed=seed,
        window=window,
        round_s=round_s,
        restart_cost_s=restart_cost_s,
        prices=prices,
        spread_slowdown=spread_slowdown,
        mechanism=mechanism,
        queues=queues,
        queue_mix=queue_mix,
    )
    with Progress(
        TextColumn(f"simulating {policy}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs finished"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("sim", total=None)
        result = simulation.run(
            request, progress=lambda done, total: bar.update(task, completed=done, total=total)
        )
    summary = {"policy": policy, **result.to_dict()}
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
        return
    table(
        f"{policy} on {cluster}",
        ["jobs", "avg JCT h", "p50 h", "p99 h", "makespan h", "util", "restarts/job", "worst FTF rho",
         "cost $", "solve ms p50"],
        [[result.jobs_measured, result.avg_jct_h, result.p50_jct_h, result.p99_jct_h, result.makespan_h,
          f"{result.utilization:.1%}", result.restarts_per_job, result.worst_ftf_rho, result.cost_usd,
          result.policy_solve_ms_p50]],
    )  # fmt: skip
    if result.avg_jct_h_by_queue:
        table("by queue", ["queue", "avg JCT h"], sorted(result.avg_jct_h_by_queue.items()))


@sub_app.command("policies")
def policies(json_out: JsonOpt = False) -> None:
    """The allocation policies, the default first."""
    names = [DEFAULT_POLICY, *(n for n in POLICIES if n != DEFAULT_POLICY)]
    if json_out:
        typer.echo(json.dumps(names))
        return
    for name in names:
        default = " (default)" if name == DEFAULT_POLICY else ""
        console.print(f"[bold]{name}[/]{default}: {POLICIES[name].summary}")


def register(app: typer.Typer) -> None:
    app.add_typer(sub_app, name="sim")
