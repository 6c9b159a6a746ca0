"""Bad input: one clear error naming the problem and the fix, exit code 1, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builders import write_spec
from tests.conftest import Cli

pytestmark = pytest.mark.integration


def expect_error(cli: Cli, *args: str, message: str, hint: str) -> None:
    done = cli.run(*args, check=False)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert message in done.stderr, done.stderr
    assert f"Hint: {hint}" in done.stderr.replace("\n", " "), done.stderr


def test_malformed_yaml(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nmodel: preset: llama-tiny\n")
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="is not valid YAML at line 2",
        hint="check the indentation",
    )


def test_unknown_field(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, training={"stepz": 3})
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="unknown field `training.stepz`",
        hint="fix the fields named above",
    )


def test_unknown_preset(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, model={"preset": "llama-3b"})
    expect_error(cli, "jobs", "submit", str(spec), message="valid presets: llama-tiny", hint="fix the fields")


def test_missing_dataset(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, data={"paths": ["no/such/dir/*.txt"]})
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="no/such/dir/*.txt' does not exist or matches no file",
        hint="fix data.paths",
    )


def test_empty_dataset(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    spec = write_spec(tmp_path, data={"paths": ["empty"]})  # relative to the spec's folder
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="is empty (1 files, 0 bytes)",
        hint="point data.paths",
    )


def test_more_devices_than_the_machine_has(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, resources={"accelerator": ["h100-sxm", "cpu"], "devices": 64})
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="can never run on this node: h100-sxm: needs 64 devices, this node has none; "
        "cpu: needs 64 cores",
        hint="this node has cpu:",
    )


def test_more_device_memory_than_the_machine_has(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, resources={"accelerator": "cpu", "min_memory_gib": 1e6})
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        message="can never run on this node: cpu: needs 1e+06 GiB of memory, this node has",
        hint="this node has cpu:",
    )


def test_spec_file_that_does_not_exist(cli: Cli, tmp_path: Path) -> None:
    expect_error(
        cli,
        "jobs",
        "submit",
        str(tmp_path / "nope.yaml"),
        message="does not exist",
        hint="give the path",
    )


def test_unknown_job_and_model(cli: Cli) -> None:
    expect_error(
        cli,
        "jobs",
        "show",
        "nope-123",
        message="no job with id 'nope-123'",
        hint="`shipyard jobs list`",
    )
    expect_error(
        cli,
        "generate",
        "nope",
        "--prompt",
        "x",
        message="no model version nope",
        hint="`shipyard models list`",
    )


def test_resume_without_an_earlier_checkpoint(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        "--resume",
        message="no earlier job named 'tiny'",
        hint="submit without --resume",
    )


def test_resume_and_resume_from_together_are_refused(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    expect_error(
        cli,
        "jobs",
        "submit",
        str(spec),
        "--resume",
        "--resume-from",
        str(tmp_path),
        message="--resume and --resume-from were both given",
        hint="--resume for the newest checkpoint of the last job named 'tiny', or --resume-from",
    )
    assert cli.json("jobs", "list") == []  # refused before anything was queued


def test_debug_shows_the_traceback(cli: Cli, tmp_path: Path) -> None:
    cli.env["SHIPYARD_DEBUG"] = "1"
    done = cli.run("jobs", "submit", str(tmp_path / "nope.yaml"), check=False)
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_a_bad_submit_leaves_no_job_behind(cli: Cli, tmp_path: Path) -> None:
    cli.run("jobs", "submit", str(write_spec(tmp_path, training={"stepz": 1})), check=False)
    assert cli.json("jobs", "list") == []


def test_the_cli_imports_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys, shipyard.cli.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_bad_queue_configurations_change_nothing(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "queues.yaml"
    bad.write_text("clusterQueues: [{name: a, nominal: {cpu: 2}}]\nlocalQueues: {team: b}\n")
    expect_error(
        cli,
        "queues",
        "apply",
        str(bad),
        message="local queues point at unknown cluster queues (team -> b)",
        hint="write clusterQueues",
    )
    bad.write_text("clusterQueues: [{name: a, nominal: {cpu: many}}]\n")
    expect_error(
        cli, "queues", "apply", str(bad), message="`clusterQueues.0.nominal.cpu`", hint="write clusterQueues"
    )
    expect_error(
        cli,
        "queues",
        "set",
        "a",
        "--nominal",
        "cpu",
        message="--nominal 'cpu' is not TYPE=DEVICES",
        hint="e.g.",
    )
    expect_error(
        cli, "queues", "remove", "a", message="no cluster queue named 'a'", hint="cluster queues: none"
    )
    assert cli.json("queues", "config")["config"] is None  # nothing was applied


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)
"""Nine levels of nine aliases: under a kilobyte that expands to 9**10 values."""


@pytest.mark.parametrize(
    ("content", "message", "hint"),
    [
        (BOMB.encode(), "holds more than 20,000 values", "a document holds settings"),
        (b"name: x\n" + b"a: " + b"[" * 5000 + b"]" * 5000, "nests deeper than 32 levels", "a job spec is"),
        (
            bytes(range(256)),
            "is not UTF-8 text (byte 128 is 0x80)",
            "give a YAML job spec, not a binary file",
        ),
        (b"name: " + b"x" * (2 << 20), "is 2,097,158 bytes; at most 1,048,576 are read", "a job spec holds"),
    ],
    ids=["alias-bomb", "deep", "binary", "huge"],
)
def test_hostile_spec_files(cli: Cli, tmp_path: Path, content: bytes, message: str, hint: str) -> None:
    spec = tmp_path / "hostile.yaml"
    spec.write_bytes(content)
    expect_error(cli, "jobs", "submit", str(spec), message=message, hint=hint)


def test_a_folder_as_the_spec(cli: Cli, tmp_path: Path) -> None:
    expect_error(
        cli, "jobs", "submit", str(tmp_path), message="is a folder, not a file", hint="give the path"
    )


def test_strict_types_and_bounds_in_a_spec(cli: Cli, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, training={"steps": True})
    expect_error(cli, "jobs", "submit", str(spec), message="`training.steps`: Input should be a valid",
                 hint="fix the fields")  # fmt: skip
    spec = write_spec(tmp_path, priority=10**30)
    expect_error(cli, "jobs", "submit", str(spec), message="`priority`: Input should be less than or equal",
                 hint="fix the fields")  # fmt: skip
    spec = write_spec(tmp_path, resources={"accelerator": "h100"})
    expect_error(cli, "jobs", "submit", str(spec), message="did you mean 'h100-pcie'?", hint="fix the fields")


def test_a_binary_file_as_training_text(cli: Cli, tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x80\x81" + bytes(range(256)) * 16)
    spec = write_spec(tmp_path, data={"paths": [str(weights)]})
    expect_error(
        cli, "jobs", "submit", str(spec), message="is not UTF-8 text", hint="give text or JSONL files"
    )


def test_json_errors_are_one_object_on_stderr(cli: Cli) -> None:
    for args, code in ((["jobs", "show", "nope"], "not_found"), (["jobs", "show", "--bogus"], "usage_error")):
        done = cli.run(*args, "--json", check=False)
        assert done.returncode == 1 and done.stdout == ""
        error = json.loads(done.stderr)
        assert set(error) == {"code", "message", "hint"} and error["code"] == code


def test_commands_never_overwrite_a_file_without_force(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    source.write_bytes(b"stored bytes")
    cli.run("storage", "put", str(source), "w.bin")
    target = tmp_path / "mine.txt"
    for command, written in ((["storage", "get", "w.bin", str(target)], b"stored bytes"),
                             (["audit", "export", "--out", str(target)], b"{")):  # fmt: skip
        target.write_text("my own notes")
        expect_error(
            cli, *command, message="exists; nothing was written", hint="give another path, or --force"
        )
        assert target.read_text() == "my own notes"
        cli.run(*command, "--force")
        assert target.read_bytes().startswith(written)


def test_bad_planner_figures_and_storage_roots(cli: Cli, tmp_path: Path) -> None:
    for value in ("inf", "nan", "1e400"):
        expect_error(cli, "plan", "train", "--params", value, "--accelerator", "h100-sxm", "--count", "8",
                     message="--params must be above zero", hint="give --params a finite")  # fmt: skip
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    expect_error(
        cli, "storage", "roots", "add", str(a_file), message="is a file, not a folder", hint="give a folder"
    )
    expect_error(cli, "storage", "roots", "add", str(tmp_path / "r"), "--rack", "r1\x1b[31m",
                 message="`rack`", hint="name --rack")  # fmt: skip


def test_counts_that_would_exhaust_the_machine(cli: Cli) -> None:
    huge = str(10**23)
    gavel = Path(__file__).resolve().parents[3] / "shared" / "data" / "scheduling" / "gavel"
    sim = ["sim", "run", "--throughputs", str(gavel / "simulation_throughputs.json"), "--cluster", "v100=8"]
    cases = [
        (
            [*sim, "--static-jobs", huge],
            "--static-jobs must be above zero and at most 1e+06",
            "give --static",
        ),
        ([*sim, "--rate", "1", "--round-s", "nan"], "--round-s must be above zero", "give --round-s"),
        (["jobs", "list", "--limit", huge], "--limit must be 1 to 1000", "narrow the list"),
        (
            ["generate", "m", "-p", "x", "--max-new-tokens", huge],
            "--max-new-tokens must be",
            "give --max-new",
        ),
    ]
    for args, message, hint in cases:
        expect_error(cli, *args, message=message, hint=hint)
