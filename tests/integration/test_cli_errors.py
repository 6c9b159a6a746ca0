"""Bad input: one clear error naming the problem and the fix, exit code 1, no traceback."""

from __future__ import annotations

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
