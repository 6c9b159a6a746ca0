"""`shipyard spec` and `shipyard spec example`: the reference a newcomer reads, and starters that
`jobs submit` accepts as they are written (the home's one queue has no quota, so the jobs wait
and nothing trains)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shipyard.schemas.spec_reference import reference
from tests.conftest import Cli
from tests.support import tiny_models

pytestmark = pytest.mark.integration

HOLD = "clusterQueues: [{name: hold, nominal: {cpu: 0}}]\nlocalQueues: {default: hold}\n"


def test_spec_lists_every_field_as_text_and_as_json(cli: Cli) -> None:
    shown = cli.run("spec").stdout
    listed = cli.json("spec")
    assert [f["path"] for f in listed] == [d.path for d in reference()]
    for field in listed:
        assert field["path"] in shown and field["description"]
    assert "``" not in shown
    lr = next(f for f in listed if f["path"] == "training.optimizer.lr")
    assert lr["type"] == "number" and lr["default"] == "0.0003" and lr["valid"] == "> 0 and <= 10"


def test_an_unknown_section_exits_1_naming_the_sections(cli: Cli) -> None:
    done = cli.run("spec", "--section", "optimizer", check=False)
    assert done.returncode == 1 and "no section 'optimizer'" in done.stderr
    assert "training.optimizer" in done.stderr and "Traceback" not in done.stderr


def test_a_bad_spec_points_at_the_reference(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(cli.run("spec", "example", "pretrain").stdout.replace("seq_len: 128", "seq_len: long"))
    done = cli.run("jobs", "submit", str(bad), check=False)
    assert done.returncode == 1 and "training.seq_len" in done.stderr
    assert "shipyard spec" in done.stderr


def test_the_pretrain_starter_submits_as_it_is(cli: Cli, tmp_path: Path) -> None:
    (cli.home / "queues.yaml").parent.mkdir(parents=True, exist_ok=True)
    (cli.home / "queues.yaml").write_text(HOLD)
    job = tmp_path / "job.yaml"
    written = cli.run("spec", "example", "pretrain", "-o", str(job))
    assert "wrote" in written.stderr and job.is_file()
    view = cli.json("jobs", "submit", str(job))
    assert view["state"] == "queued" and view["name"] == "my-first-model"

    again = cli.run("spec", "example", "pretrain", "-o", str(job), check=False)
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert cli.run("spec", "example", "multi-node", "-o", str(job), "--force").returncode == 0
    assert "nodes: 2" in job.read_text()


def test_the_finetune_starter_submits_with_a_model_and_chats(cli: Cli, tmp_path: Path) -> None:
    (cli.home / "queues.yaml").parent.mkdir(parents=True, exist_ok=True)
    (cli.home / "queues.yaml").write_text(HOLD)
    model = tiny_models.build(tmp_path / "qwen", "qwen2")
    chats = tiny_models.write_jsonl(tmp_path / "chats.jsonl", tiny_models.chat_records(64))
    job = tmp_path / "finetune.yaml"
    cli.run("spec", "example", "finetune", "--model", str(model), "--data", str(chats), "-o", str(job))
    view = cli.json("jobs", "submit", str(job))
    assert view["state"] == "queued"
    assert cli.json("jobs", "show", view["id"])["name"] == "my-assistant"


def test_jobs_list_and_queue_tell_one_story_about_a_waiting_job(cli: Cli, tmp_path: Path) -> None:
    """Whatever the moment: before the agent's first pass and after it, both commands read the
    reason the scheduler recorded."""
    (cli.home / "queues.yaml").parent.mkdir(parents=True, exist_ok=True)
    (cli.home / "queues.yaml").write_text(HOLD)
    job = tmp_path / "job.yaml"
    cli.run("spec", "example", "pretrain", "-o", str(job))
    submitted = cli.json("jobs", "submit", str(job))
    deadline = time.monotonic() + 60
    while True:
        [listed] = cli.json("jobs", "list")
        [queued] = cli.json("queue")
        [again] = cli.json("jobs", "list")
        assert listed["id"] == queued["id"] == submitted["id"]
        if listed["pending_reason"] == again["pending_reason"]:  # no pass in between
            assert queued["reason"] == listed["pending_reason"]
        if "quota" in queued["reason"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    [listed], [queued] = cli.json("jobs", "list"), cli.json("queue")  # the reason holds from now on
    assert "quota" in queued["reason"] and queued["reason"] == listed["pending_reason"]
