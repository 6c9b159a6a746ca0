"""How ``shipyard plan`` shows a plan to a person: sections of fields, and the comparison table."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from shipyard.cli._output import console, fmt, table
from shipyard.domain.text import printable
from shipyard.planner.advisor import RANKINGS, Comparison, best_of, price_caveat
from shipyard.planner.inference import INFERENCE_EVIDENCE, InferencePlan, InferenceWorkload
from shipyard.planner.training import TrainingPlan
from shipyard.planner.workload import TrainingWorkload


def plan_title(work: TrainingWorkload | InferenceWorkload, workload: str) -> str:
    size = f"{work.model.params / 1e9:.3g}B"
    if isinstance(work, InferenceWorkload):
        return f"{size} inference, {work.precision}, batch {work.batch}, context {work.context}"
    return f"{size} {workload}, {work.precision}, {work.budget_tokens:.3g} tokens"


def _fits(fits: bool, reason: str | None) -> Text:
    return (
        Text("yes", style="green") if fits else Text.assemble(("no", "red"), f": {printable(reason or '')}")
    )


def _host_label(step: dict[str, Any]) -> str:
    """A GPU's host queues kernels during the step (the longer of the two counts); a CPU's is in series."""
    return "  host queuing kernels (overlapped)" if step.get("host_overlaps") else "  operator dispatch"


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) >= 1e7 else fmt(float(value))
    return f"{text} {unit}".rstrip()


def _section(title: str, pairs: list[tuple[str, str]]) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in pairs:
        grid.add_row(name, value)
    console.print(f"[bold underline]{title}[/]")
    console.print(grid)


def _memory_pairs(memory: dict[str, float]) -> list[tuple[str, str]]:
    parts = ("weights", "gradients", "optimizer", "activations", "kv_cache", "buffers", "reserve")
    pairs = [(p.replace("_", " "), _number(memory[f"{p}_gib"], "GiB")) for p in parts if memory[f"{p}_gib"]]
    return [
        *pairs,
        ("total", _number(memory["total_gib"], "GiB")),
        ("usable", _number(memory["usable_gib"], "GiB")),
    ]


def _print_assumptions(assumptions: list[str]) -> None:
    console.print("[bold underline]assumptions[/]")
    for line in assumptions:
        console.print(f"  - {line}")


def _spread(span: dict[str, float] | None, unit: str = "", lead: str = " (") -> str:
    """`` (80%: 9.1-12 h)``: the range a figure carries (the planner's cross-validated error)."""
    if span is None:
        return ""
    return f"{lead}80%: {_number(span['low'])}-{_number(span['high'], unit)}{')' if lead == ' (' else ''}"


def print_training(plan: TrainingPlan) -> None:
    d = plan.to_dict()
    p = d["parallelism"]
    step = d["step"]
    chosen = "searched: the fastest that fits" if p["searched"] else "as given"
    console.print(
        f"[bold]{d['model']['params'] / 1e9:.3g}B {d['workload']}[/] on {d['count']} x {d['accelerator']}: "
        f"fits {_fits(d['fits'], d['reason'])}"
    )
    _section(
        f"layout ({chosen})",
        [
            ("tp x pp x dp", f"{p['tp']} x {p['pp']} x {p['dp']}"),
            ("zero", str(p["zero"])),
            ("recompute", p["recompute"]),
            ("micro-batch", f"{p['micro_batch']} sequences"),
        ],
    )
    _section("memory per device", _memory_pairs(d["memory"]))
    _section(
        "time",
        [
            ("step", _number(d["step_time_s"], "s")),
            ("  compute", _number(step["compute_s"], "s")),
            ("  tensor parallel", _number(step["tensor_parallel_s"], "s")),
            ("  pipeline bubble", _number(step["pipeline_bubble_s"], "s")),
            ("  data parallel (exposed)", _number(step["data_parallel_exposed_s"], "s")),
            ("  optimizer", _number(step["optimizer_s"], "s")),
            *([(_host_label(step), _number(step["host_s"], "s"))] if step.get("host_s") else []),
            (
                "tokens/s",
                f"{_number(d['tokens_per_s'])} ({_number(d['tokens_per_s_per_device'])} per device"
                f"{_spread(d['tokens_per_s_per_device_range'], lead='; ')})",
            ),
            ("TFLOPS per device", f"{_number(d['tflops_per_device'])} (MFU {d['mfu']:.1%})"),
            ("tokens", _number(d["tokens"]) + (" (assumed)" if d["tokens_assumed"] else "")),
            (
                "wall time",
                f"{_number(d['wall_time_h'], 'h')}{_spread(d['wall_time_h_range'], 'h')} "
                f"({d['wall_time_h'] / 24:.3g} days, "
                + (
                    f"a whole run: goodput {d['goodput']:.1%} after {plan.overheads.describe()})"
                    if d["measure"] == "run"
                    else "steady state: the training steps alone)"
                ),
            ),
            ("GPU-hours", _number(d["gpu_hours"])),
            (
                "cost",
                _number(d["cost_usd"], "$")
                + _spread(d["cost_usd_range"], "$")
                + (f" at ${d['price_usd_per_h']:.3g}/h" if d["cost_usd"] else ""),
            ),
            ("energy", _number(d["energy_kwh"], "kWh") + _spread(d["energy_kwh_range"], "kWh")),
        ],
    )
    _print_assumptions(d["assumptions"])


def print_inference(plan: InferencePlan) -> None:
    d = plan.to_dict()
    console.print(
        f"[bold]{d['model']['params'] / 1e9:.3g}B inference[/] ({d['model']['precision']}) on {d['count']} x "
        f"{d['accelerator']} with tp={d['parallelism']['tp']}: fits {_fits(d['fits'], d['reason'])}"
    )
    _section("memory per device", _memory_pairs(d["memory"]))
    _section(
        "speed",
        [
            ("prefill", _number(d["prefill_tokens_per_s"], "tokens/s")),
            ("decode", f"{_number(d['decode_tokens_per_s'], 'tokens/s')} (bound by {d['decode_bound']})"),
            ("decode per sequence", _number(d["decode_tokens_per_s_per_sequence"], "tokens/s")),
            ("cost per 1M tokens", _number(d["cost_usd_per_million_tokens"], "$")),
            ("energy per 1M tokens", _number(d["energy_kwh_per_million_tokens"], "kWh")),
        ],
    )
    _print_assumptions(d["assumptions"])


COMPARED_COLUMNS = ("#", "accelerator", "count", "fits", "GiB/device", "tokens/s", "evidence")
TIE_WORDS = {"time": "faster", "cost": "cheaper", "energy": "more frugal"}


def print_comparison(rows: list[Comparison], workload: str, rank_by: str, title: str) -> None:
    inference = workload == "infer"
    time_label = "h per 1M tokens" if inference else "wall h"
    cost_label = "$ per 1M tokens" if inference else "cost $"
    energy_label = "kWh per 1M" if inference else "energy kWh"
    best = {name: best_of(rows, name) for name in RANKINGS}

    def mark(row: Comparison, name: str, value: float | None) -> Text:
        text = _number(value)
        return Text(f"{text}*", style="bold green") if row in best[name] else Text(text)

    table(
        f"{title} — ranked by {rank_by} (* best, or tied with it: 80% ranges overlap; = shares its rank)",
        [*COMPARED_COLUMNS, time_label, cost_label, energy_label],
        [
            (
                f"{r.rank}=" if r.tied else r.rank or "-",
                r.accelerator,
                r.count,
                _fits(r.fits, r.plan.not_fitting_reason()),
                round(r.plan.memory.total_gib, 1),
                _number(
                    r.plan.decode_tokens_per_s if isinstance(r.plan, InferencePlan) else r.plan.tokens_per_s
                ),
                "no runs" if isinstance(r.plan, InferencePlan) else r.plan.evidence.short,
                mark(r, "time", r.time_h),
                mark(r, "cost", r.cost_usd),
                mark(r, "energy", r.energy_kwh),
            )
            for r in rows
        ],
    )
    if any(r.cost_usd is None for r in rows):
        console.print("cost '-': no price in the catalog; add price_usd_per_h in a --hardware file")
    priced = [r for r in rows if r.cost_usd is not None]
    if priced:
        console.print("prices used:", markup=False)
        for row in priced:
            console.print(f"  {row.plan.cluster.accelerator.price_basis}", markup=False, soft_wrap=True)
    if inference:
        console.print(f"evidence: {INFERENCE_EVIDENCE}", markup=False, soft_wrap=True)
    else:
        console.print(
            "evidence (published training runs the throughput rests on, 'peak only': none; and the 80% range "
            "of what a run measures, from the planner's cross-validated errors):"
        )
        for row in rows:
            if isinstance(row.plan, TrainingPlan):
                evidence = row.plan.evidence
                console.print(f"  {evidence.words}; {evidence.range_words}", markup=False, soft_wrap=True)
    for name in RANKINGS:
        if len(best[name]) > 1:
            console.print(
                f"tied on {name}: {', '.join(r.accelerator for r in best[name])} (their 80% ranges overlap: "
                f"none is called {TIE_WORDS[name]})",
                markup=False,
                soft_wrap=True,
            )
    if (caveat := price_caveat(rows)) is not None:
        console.print(f"[yellow]note:[/] {caveat}")
