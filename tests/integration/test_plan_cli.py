"""`shipyard plan` as other tools call it: the JSON contract, the chart, bad input, and the same
numbers as the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard.hardware.catalog import lookup
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import plan_training
from shipyard.planner.workload import LayoutRequest, TrainingWorkload, cluster_of
from tests.conftest import Cli

pytestmark = pytest.mark.integration

GPT3_ON_H100 = [
    "--params", "175e9", "--layers", "96", "--hidden", "12288", "--heads", "96", "--seq-len", "2048",
    "--global-batch-tokens", "3145728", "--tokens", "300e9",
    "--accelerator", "h100-sxm", "--count", "1024",
    "--tp", "8", "--pp", "8", "--zero", "1", "--recompute", "selective", "--precision", "bf16",
]  # fmt: skip


def test_plan_train_json_contract_and_api_agree(cli: Cli) -> None:
    out = cli.json("plan", "train", *GPT3_ON_H100)
    contract = ["fits", "memory_gib_per_device", "step_time_s", "tokens_per_s", "tokens_per_s_per_device",
                "tflops_per_device", "mfu", "wall_time_h", "gpu_hours", "cost_usd", "energy_kwh"]  # fmt: skip
    assert [key for key in contract if key not in out] == []
    assert out["fits"] is True and 0 < out["mfu"] < 1
    assert out["parallelism"] == {
        **out["parallelism"],
        "tp": 8,
        "pp": 8,
        "dp": 16,
        "zero": 1,
        "recompute": "selective",
    }
    api = plan_training(
        TrainingWorkload(
            model=model_shape(175e9, layers=96, hidden=12288, heads=96),
            seq_len=2048,
            global_batch_tokens=3145728,
            tokens=300e9,
            precision="bf16",
        ),
        cluster_of(lookup("h100-sxm"), 1024),
        LayoutRequest(tp=8, pp=8, zero=1, recompute="selective"),
    )
    assert out["tokens_per_s"] == pytest.approx(api.tokens_per_s)
    assert out["wall_time_h"] == pytest.approx(api.wall_time_h)
    assert out["cost_usd"] == pytest.approx(api.gpu_hours * 2.5)


def test_plan_train_needs_only_params_accelerator_and_count(cli: Cli) -> None:
    out = cli.json("plan", "train", "--params", "7e9", "--accelerator", "a100-80gb", "--count", "8")
    assert out["fits"] and out["parallelism"]["searched"]
    assert out["model"]["layers"] == 32 and out["model"]["hidden"] == 4096
    assert any("derived from --params" in line for line in out["assumptions"])
    table = cli.run("plan", "train", "--params", "7e9", "--accelerator", "a100-80gb", "--count", "8").stdout
    assert "searched: the fastest that fits" in table and "MFU" in table
    assert out["measure"] == "run" and "a whole run: goodput" in table
    steady = cli.json("plan", "train", "--params", "7e9", "--accelerator", "a100-80gb", "--count", "8",
                      "--measure", "steady")  # fmt: skip
    assert (steady["measure"], steady["goodput"], steady["tokens_per_s"]) == (
        "steady",
        1.0,
        out["tokens_per_s"],
    )
    assert steady["wall_time_h"] == pytest.approx(out["wall_time_h"] * out["goodput"])
    assert steady["run_overheads"] is None and set(out["run_overheads"]) >= {
        "interruptions",
        "checkpoints",
        "evaluation",
    }
    assert "interruptions" in table and "checkpoints" in table and "evaluation" in table
    # A run's own cadence: no evaluation, a checkpoint every hour.
    own = cli.json("plan", "train", "--params", "7e9", "--accelerator", "a100-80gb", "--count", "8",
                   "--eval-every", "0", "--checkpoint-every", "1")  # fmt: skip
    assert own["run_overheads"]["evaluation"] == 0 and own["run_overheads"]["checkpoint_every_h"] == 1
    assert own["goodput"] > out["goodput"]


def test_plan_infer_json_contract(cli: Cli) -> None:
    base = ["plan", "infer", "--params", "65e9", "--layers", "80", "--hidden", "8192", "--heads", "64",
            "--count", "1", "--batch", "1", "--context", "2048", "--precision", "fp16"]  # fmt: skip
    m2 = cli.json(*base, "--accelerator", "m2-ultra")
    h100 = cli.json(*base, "--accelerator", "h100-sxm")
    for key in ("fits", "memory_gib_per_device", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert key in m2
    assert m2["fits"] is True and h100["fits"] is False
    assert "needs" in h100["reason"]


def test_plan_compare_ranks_marks_and_draws(cli: Cli, tmp_path: Path) -> None:
    chart = tmp_path / "compare.png"
    done = cli.run(
        "plan", "compare", "--workload", "infer", "--params", "65e9", "--layers", "80", "--hidden", "8192",
        "--heads", "64", "--count", "1", "--accelerators", "h100-sxm,a800,m2-ultra",
        "--plot", str(chart), "--json",
    )  # fmt: skip
    rows = json.loads(done.stdout)["rows"]
    by_key = {r["accelerator"]: r for r in rows}
    assert by_key["m2-ultra"]["fits"] and by_key["m2-ultra"]["rank"] == 1
    assert not by_key["h100-sxm"]["fits"] and "needs" in by_key["h100-sxm"]["reason"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A training plan has 80% ranges: drawn as error bars on its bars.
    ranged = tmp_path / "lora.png"
    table = cli.run("plan", "compare", "--params", "7e9", "--workload", "lora", "--plot", str(ranged)).stdout
    assert "ranked by cost" in table and "a800" in table
    assert ranged.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "-1", "--accelerator", "h100-sxm", "--count", "8"], "--params must be above zero"),
        (["--params", "inf", "--accelerator", "h100-sxm", "--count", "8"], "--params must be above zero"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--tokens", "nan"],
         "--tokens must be above zero"),
        (["--params", "7e9", "--hidden", "4096", "--heads", "30", "--accelerator", "h100-sxm",
          "--count", "8"], "--heads 30 does not divide --hidden 4096"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "4", "--tp", "8"],
         "--tp 8 is larger than --count 4"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "12", "--tp", "8"],
         "does not divide --count 12"),
        (["--params", "7e9", "--accelerator", "mi300", "--count", "8"], "unknown accelerator type 'mi300'"),
        (["--params", "seven", "--accelerator", "h100-sxm", "--count", "8"], "Invalid value for '--params'"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--measure", "peak"],
         "--measure 'peak' is not one of steady, run"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--checkpoint-every", "0"],
         "--checkpoint-every must be above zero"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--eval-every", "-5"],
         "must be zero or more"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--fabric", "2"],
         "--fabric '2' is not OVERSUBSCRIPTION:LEAF_NODES"),
        (["--params", "7e9", "--accelerator", "h100-sxm", "--count", "8", "--fabric", "0.5:16"],
         "the oversubscription must be 1 to 64"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_error(cli: Cli, args: list[str], message: str) -> None:
    done = cli.run("plan", "train", *args, check=False)
    assert done.returncode == 1
    assert message in done.stderr and "Traceback" not in done.stderr


def test_unknown_accelerator_suggests_the_closest(cli: Cli) -> None:
    done = cli.run("plan", "train", "--params", "7e9", "--accelerator", "mi300", "--count", "8", check=False)
    assert "did you mean 'mi300x'?" in done.stderr.replace("\n", " ")


def test_a_hardware_file_in_the_home_sets_prices(cli: Cli) -> None:
    cli.home.mkdir(parents=True, exist_ok=True)
    (cli.home / "hardware.yaml").write_text("- key: a800\n  price_usd_per_h: 1.1\n")
    out = cli.json(
        "plan", "train", "--params", "1e9", "--accelerator", "a800", "--count", "8", "--tokens", "1e10"
    )
    assert out["cost_usd"] == pytest.approx(out["gpu_hours"] * 1.1)
    for name in ("tokens_per_s_per_device", "wall_time_h", "cost_usd", "energy_kwh"):  # each with its range
        assert out[f"{name}_range"]["low"] < out[name] < out[f"{name}_range"]["high"]
    hardware = str(cli.home / "hardware.yaml")
    assert out["price"] | {"basis": None} == {
        "usd_per_h": 1.1, "kind": "rental", "source": None, "as_of": None, "from": hardware, "basis": None
    }  # fmt: skip
    # The advisor lists the prices it costed with, whose they are, and warns of unlike ones.
    types = "a800,h100-sxm,gaudi3"
    shown = cli.run("plan", "compare", "--params", "1e9", "--accelerators", types, "--count", "8")
    said = " ".join(shown.stdout.split())
    assert f"a800: $1.1/h rental (date not given; your hardware file {hardware})" in said
    assert "h100-sxm: $2.5/h rental (" in said and "; as of 2026-11-30; built-in catalog)" in said
    assert "gaudi3 is costed at a purchase price over 3 years" in said
    # And the evidence each throughput rests on: published runs, or the peak alone.
    assert "h100-sxm (16-bit):" in said and " published runs from " in said
    assert "gaudi3 (16-bit): no published training run; extrapolated from its peak" in said
    assert "; 80% range: -" in said and "% of the planned throughput" in said


def test_submit_refuses_a_job_this_machine_cannot_hold(cli: Cli, tmp_path: Path) -> None:
    from tests.builders import write_spec

    spec = write_spec(
        tmp_path,
        model={"preset": "llama-7b"},
        training={"steps": 2, "global_batch_tokens": 65536, "micro_batch_size": 32, "seq_len": 2048},
    )
    done = cli.run("jobs", "submit", str(spec), check=False)
    assert done.returncode == 1
    error = " ".join(done.stderr.split())  # as one line, whatever the terminal's width wrapped
    assert "GiB per device at best (tp=1" in error and "the largest accelerator here has" in error
    assert cli.json("jobs", "list") == []
