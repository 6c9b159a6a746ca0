"""Service use cases on a real SQLite database, with no agent running (no ``start_agent``)
and a fake vendor query standing in for a node with two cores."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import pytest

from shipyard import agent, audit
from shipyard.agent import leasing, outputs, telemetry
from shipyard.db import Job
from shipyard.errors import Conflict, Forbidden, InvalidSpec, NotFound, Unschedulable
from shipyard.hardware import VendorQueries
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.jobs import jobs, submissions
from shipyard.settings import Settings
from tests.builders import spec_dict
from tests.unit.conftest import TWO_CORES

TRAINING = spec_dict()["training"]


def test_submit_queues_with_a_reason_and_absolute_paths(ctx: ServiceContext, tmp_path: Path) -> None:
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))
    assert view.state == "queued" and view.pending_reason == "waiting for the local agent to pick it up"
    assert view.id.startswith("tiny-") and Path(view.run_dir) == ctx.settings.runs_dir / view.id
    assert Path(view.run_dir).is_absolute()
    assert [j.id for j in jobs.list_jobs(ctx)] == [view.id]


def test_a_job_larger_than_the_node_is_refused_at_submit(ctx: ServiceContext) -> None:
    with pytest.raises(Unschedulable, match="cpu: needs 4 cores") as err:
        jobs.submit(ctx, validate_job_spec(spec_dict(resources={"accelerator": "cpu", "devices": 4})))
    assert "this node has cpu: 2" in (err.value.hint or "")


def test_cancel_wins_over_a_later_claim(ctx: ServiceContext) -> None:
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))
    with ctx.db.transaction() as session:
        from shipyard.db import Job

        job = session.get(Job, view.id)
        assert job is not None
        jobs.cancel(ctx, view.id)  # another process cancels after the agent read the job
        assert leasing.claim(session, job, datetime.now(UTC)) is False
        assert job.state == "cancelled"
    with pytest.raises(Conflict, match="already cancelled"):
        jobs.cancel(ctx, view.id)


def test_cancelling_a_running_job_asks_it_to_stop(ctx: ServiceContext) -> None:
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))
    with ctx.db.transaction() as session:
        from shipyard.db import Job

        job = session.get(Job, view.id)
        assert job is not None and leasing.claim(session, job, datetime.now(UTC))
    assert jobs.cancel(ctx, view.id).state == "running"
    assert jobs.get(ctx, view.id).state == "running"
    with ctx.db.transaction() as session:
        assert session.get(Job, view.id).cancel_requested  # type: ignore[union-attr]


def test_unknown_ids_and_states(ctx: ServiceContext) -> None:
    with pytest.raises(NotFound, match="no job with id 'x'"):
        jobs.get(ctx, "x")
    with pytest.raises(Exception, match="unknown job state 'done'"):
        jobs.list_jobs(ctx, state="done")


def test_resume_from_a_checkpoints_folder_or_one_checkpoint(ctx: ServiceContext, tmp_path: Path) -> None:
    folder = tmp_path / "elsewhere" / "checkpoints"
    (folder / "step_000004").mkdir(parents=True)
    (folder / "step_000004" / "state.pt").write_bytes(b"written by the runtime")
    (folder / "latest").write_text("step_000004\n")
    spec = validate_job_spec(spec_dict())
    assert jobs.submit(ctx, spec, resume_from=str(folder)).resume_from == str(folder / "step_000004")
    assert jobs.submit(ctx, spec, resume_from=str(folder / "step_000004")).resume_from == str(
        folder / "step_000004"
    )
    with pytest.raises(NotFound, match="no checkpoint at"):
        jobs.submit(ctx, spec, resume_from=str(tmp_path / "elsewhere"))
    with pytest.raises(NotFound, match="neither a checkpoint path nor a job id"):
        jobs.submit(ctx, spec, resume_from="no-such-job")
    # Both ways at once name two checkpoints: refused, not one of them picked in silence.
    with pytest.raises(InvalidSpec, match="--resume and --resume-from were both given") as both:
        jobs.submit(ctx, spec, resume=True, resume_from=str(folder))
    assert "--resume-from JOB_ID|FOLDER" in (both.value.hint or "")


def h200_node(count: int) -> VendorQueries:
    """A fake node with H200s (this machine has none): the submit-time fit check needs one."""
    from shipyard.hardware.discovery import GIB, RawDevice

    gpus = [
        RawDevice(vendor="nvidia", index=i, name="NVIDIA H200", memory_bytes=141 * GIB) for i in range(count)
    ]
    return VendorQueries(nvidia=lambda: list(gpus), torch_devices=list, cpu=TWO_CORES.cpu)


def test_a_job_that_fits_no_accelerator_here_is_refused_with_the_numbers(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = open_context(settings, vendor_queries=h200_node(8))
    spec = spec_dict(
        model={"preset": "llama-7b"},
        training={"steps": 10, "global_batch_tokens": 65536, "micro_batch_size": 32, "seq_len": 2048},
        resources={"accelerator": ["h200", "cpu"], "devices": 1},
    )
    with pytest.raises(Unschedulable) as err:
        jobs.submit(ctx, validate_job_spec(spec))
    message = str(err.value)
    assert "needs " in message and "GiB per device at best (tp=1 x dp_shard=1" in message
    assert "the largest accelerator here has 141.0 GiB (h200)" in message
    assert "fsdp" in (err.value.hint or "")
    # The savers the spec leaves unused come first; recomputation is the planner's already.
    assert (err.value.hint or "").startswith("set training.optimizer.state_dtype: bf16;")
    assert jobs.list_jobs(ctx) == []
    ctx.close()


def test_a_fitting_job_keeps_the_planners_estimate(ctx: ServiceContext) -> None:
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))
    estimate = jobs.get(ctx, view.id).estimate
    assert estimate is not None
    assert estimate.accelerator == "cpu" and estimate.devices == 1
    assert 0 < estimate.memory_gib_per_device < 2
    assert estimate.tokens_per_s > 0 and estimate.wall_time_s > 0


def test_estimates_are_remembered_per_shape_of_job_not_per_name(ctx: ServiceContext) -> None:
    first = jobs.submit(ctx, validate_job_spec(spec_dict(name="one")))
    same_shape = jobs.submit(ctx, validate_job_spec(spec_dict(name="two")))
    longer = jobs.submit(ctx, validate_job_spec(spec_dict(name="three", training={**TRAINING, "steps": 80})))
    one, two, three = (jobs.get(ctx, v.id).estimate for v in (first, same_shape, longer))
    assert one == two and one is not None and three is not None
    assert three.wall_time_s == pytest.approx(10 * one.wall_time_s)


def test_a_job_id_drawn_twice_is_drawn_again(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the taken key is reported when the pipelined batch is read back, not by the
    insert itself: it must still be the error that makes the writer draw again."""
    draws = iter(["00000000", "00000000", "00000000", "0000beef"])
    monkeypatch.setattr(jobs.secrets, "token_hex", lambda _: next(draws))
    settings = Settings(home=tmp_path, db_url=db_url)
    ctx = open_context(settings, vendor_queries=TWO_CORES)
    spec = validate_job_spec(spec_dict(name="twin"))
    first, second = jobs.submit(ctx, spec), jobs.submit(ctx, spec)
    assert (first.id, second.id) == ("twin-00000000", "twin-0000beef")
    assert {v.id for v in jobs.list_jobs(ctx)} == {first.id, second.id}
    verdict = audit.verify_log(ctx.db, ctx.audit_key)
    assert verdict.ok and verdict.records == 2  # the refused inserts left no record
    ctx.close()


def test_each_agent_pass_reports_devices_utilization_and_its_duration(tmp_path: Path) -> None:
    """The vendor's utilization counters are faked (this machine has no GPU)."""
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    node = dataclasses.replace(h200_node(2), utilization=lambda: {0: 0.35, 1: 0.0})
    ctx = open_context(settings, vendor_queries=node)
    before = telemetry.cluster_metrics(ctx)
    assert before.agents == [] and before.queue_wait_s == {}
    assert before.jobs_by_state == dict.fromkeys(["queued", "running", "succeeded", "failed", "cancelled"], 0)

    jobs.submit(ctx, validate_job_spec(spec_dict(resources={"accelerator": "h200", "devices": 1})))
    telemetry.record_pass(ctx, "agent-1", pass_s=0.25, schedule_s=0.125)
    [status] = telemetry.cluster_metrics(ctx).agents
    assert status["devices"] == {"h200": {"total": 2, "in_use": 0}, "cpu": {"total": 2, "in_use": 0}}
    assert status["utilization"] == {"0": 0.35, "1": 0.0}
    assert (status["pass_s"], status["schedule_s"]) == (0.25, 0.125) and 0 <= status["age_s"] < 60
    assert telemetry.cluster_metrics(ctx).jobs_by_state["queued"] == 1
    ctx.close()


def test_a_finished_jobs_export_is_published_only_for_those_who_may(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """A maintainer's job publishes its export as it finishes; a member's keeps it until a
    maintainer registers it. Registering is checked, audited and done once per export."""
    from sqlalchemy import select

    from shipyard import audit
    from shipyard.db import AuditRecord, Job
    from shipyard.schemas.launch import AttemptResult
    from shipyard.services.accounts import accounts, rbac
    from shipyard.services.models import models

    for user, role in (("mia", "maintainer"), ("max", "member")):
        accounts.create_user(ctx, user, "a long enough passphrase")
        rbac.grant(ctx, "vision", user, role)
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    finished = AttemptResult(
        status="completed", step=4, export_dir=str(export), summary={"eval_loss_end": 2.5}
    )
    owners = {}
    for owner in ("mia", "max"):
        view = jobs.submit(ctx, validate_job_spec(spec_dict(name=f"job-{owner}", project="vision")))
        with ctx.db.transaction() as session:
            job = session.get(Job, view.id)
            assert job is not None
            job.owner, job.state = owner, "succeeded"
            outputs.register_outputs(ctx, session, job, finished)
        owners[owner] = view.id
    assert [(v.name, v.metrics) for v in models.list_versions(ctx)] == [("job-mia", {"eval_loss_end": 2.5})]
    assert "a maintainer can: shipyard models register" in (jobs.get(ctx, owners["max"]).message or "")

    def as_(user: str) -> ServiceContext:
        return ctx.acting_as(audit.Actor(name=user, source="test"))

    with pytest.raises(Forbidden, match=r"max may not model\.publish"):
        models.register(as_("max"), owners["max"])
    published = models.register(as_("mia"), owners["max"], "vision-lm")
    assert (published.name, published.version, published.job_id, published.step) == (
        "vision-lm",
        1,
        owners["max"],
        4,
    )
    with pytest.raises(Conflict, match="already vision/vision-lm:1"):
        models.register(as_("mia"), owners["max"], "vision-lm")
    queued = jobs.submit(ctx, validate_job_spec(spec_dict(project="vision")))
    with pytest.raises(Conflict, match="left no export to register"):
        models.register(ctx, queued.id)
    with ctx.db.transaction() as session:
        records = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "model.publish").order_by(AuditRecord.seq)
        )
        assert [(r.actor, r.outcome) for r in records] == [
            (ctx.actor.name, "ok"),
            ("max", "denied"),
            ("mia", "ok"),
        ]


def test_a_submission_refused_by_its_checks_fails_alone_in_its_batch(ctx: ServiceContext) -> None:
    """The server's writer admits a batch of concurrent submissions, then writes those that pass."""
    from concurrent.futures import Future

    ok = validate_job_spec(spec_dict())
    too_big = validate_job_spec(spec_dict(resources={"accelerator": "cpu", "devices": 4}))
    writer = submissions.SubmissionWriter(ctx.db)
    batch = [(submissions.Submission(ctx, spec), Future[jobs.JobView]()) for spec in (ok, too_big, ok)]
    try:
        writer._commit(writer._check(batch))  # one batch, as the writer's thread forms it
    finally:
        writer.close()
    assert isinstance(batch[1][1].exception(timeout=10), Unschedulable)
    stored = {j.id for j in jobs.list_jobs(ctx)}
    assert stored == {batch[0][1].result().id, batch[2][1].result().id} and len(stored) == 2


def test_a_submission_whose_request_went_away_is_not_written(ctx: ServiceContext) -> None:
    """An async request awaiting its answer is cancelled when its client disconnects; the writer
    skips it and goes on (setting the answer of a cancelled future would kill its thread)."""
    from concurrent.futures import Future

    spec = validate_job_spec(spec_dict())
    writer = submissions.SubmissionWriter(ctx.db)
    gone, kept = Future[jobs.JobView](), Future[jobs.JobView]()
    gone.cancel()
    try:
        writer._commit(writer._check([(submissions.Submission(ctx, spec), done) for done in (gone, kept)]))
        after = writer.submit(submissions.Submission(ctx, spec)).result()  # the writer's thread still serves
    finally:
        writer.close()
    assert {j.id for j in jobs.list_jobs(ctx)} == {kept.result().id, after.id}


def test_a_tensor_parallel_degree_that_splits_no_heads_evenly_is_refused_with_the_valid_ones(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = open_context(settings, vendor_queries=h200_node(8))
    spec = spec_dict(
        model={"preset": "llama-7b"},
        training={"parallelism": {"tp": 3}},
        resources={"accelerator": "h200", "devices": 6},
    )
    with pytest.raises(InvalidSpec, match="tp 3 does not split the model's 32 attention heads") as err:
        jobs.submit(ctx, validate_job_spec(spec))
    assert err.value.hint == "valid tp: 1, 2"
    ctx.close()


def test_tensor_parallelism_is_refused_for_a_model_that_trains_through_transformers(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    folder = tmp_path / "qwen"
    folder.mkdir()
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
    }
    (folder / "config.json").write_text(json.dumps(config))
    spec = spec_dict(
        model={"preset": None, "path": str(folder)},
        finetune={"method": "lora"},
        training={"parallelism": {"tp": 2}},
        resources={"accelerator": "cpu", "devices": 2},
    )
    with pytest.raises(InvalidSpec, match="tensor parallelism splits Shipyard's LLaMA") as err:
        jobs.submit(ctx, validate_job_spec(spec))
    assert "dp_shard" in (err.value.hint or "")


def test_a_checkpoint_of_another_model_is_refused_at_submit_any_layout_is_not(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoints" / "step_000004"
    folder.mkdir(parents=True)
    written = {"format": "dcp", "step": 4, "layout": {"tp": 2, "dp_shard": 2, "dp_replicate": 1}}
    tiny = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 192, "vocab_size": 512}
    (folder / "checkpoint.json").write_text(json.dumps({**written, "model": tiny, "adapters_only": False}))
    spec = validate_job_spec(spec_dict())  # llama-tiny on one process: another layout, same model
    assert jobs.submit(ctx, spec, resume_from=str(folder)).resume_from == str(folder)
    other = {**tiny, "dim": 128, "n_layers": 4}
    (folder / "checkpoint.json").write_text(json.dumps({**written, "model": other, "adapters_only": False}))
    with pytest.raises(
        InvalidSpec, match=r"cannot be resharded onto this job: dim 128 -> 64; n_layers 4 -> 2"
    ):
        jobs.submit(ctx, spec, resume_from=str(folder))


def test_more_nodes_than_the_platform_has_names_nodes_and_the_cluster_setup(ctx: ServiceContext) -> None:
    spec = validate_job_spec(spec_dict(resources={"accelerator": "cpu", "devices": 1, "nodes": 2}))
    with pytest.raises(Unschedulable, match=r"resources.nodes: 2, and this platform has 1 node\b") as err:
        jobs.submit(ctx, spec)
    assert "shipyard node start --head" in (err.value.hint or "")
    assert jobs.list_jobs(ctx) == []


def test_jobs_list_and_queue_give_a_waiting_job_the_same_reason(tmp_path: Path) -> None:
    """Both read the reason the scheduler's pass recorded, before the first pass and after it."""
    from shipyard.agent.scheduler import queue_status

    (tmp_path / "queues.yaml").write_text(
        "clusterQueues: [{name: hold, nominal: {cpu: 0}}]\nlocalQueues: {default: hold}\n"
    )
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = open_context(settings, vendor_queries=TWO_CORES)
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))

    def reasons() -> tuple[str | None, str]:
        [listed] = jobs.list_jobs(ctx)
        [pending] = queue_status(ctx).pending
        assert listed.id == pending.id == view.id
        return listed.pending_reason, pending.reason

    listed, queued = reasons()
    assert listed == queued == "waiting for the local agent to pick it up"
    agent.tick(ctx, "agent-1")
    listed, queued = reasons()
    assert listed == queued and "quota" in queued
    ctx.close()


def test_model_names_are_their_projects_and_others_answer_as_if_missing(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """Two projects' models of one name are two models: publishing and promoting one never
    touches the other, a spec's ``model.version`` means its own project's, and a model of a
    project the caller cannot see is answered exactly like one that does not exist."""
    from shipyard.db import Job
    from shipyard.schemas.launch import AttemptResult
    from shipyard.services.accounts import accounts, rbac
    from shipyard.services.models import models
    from shipyard.services.models import sources as model_sources

    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    finished = AttemptResult(status="completed", step=2, export_dir=str(export), summary={})
    for project in ("a", "b", "a"):  # the local user publishes as each job finishes
        view = jobs.submit(ctx, validate_job_spec(spec_dict(name="shared", project=project)))
        with ctx.db.transaction() as session:
            job = session.get(Job, view.id)
            assert job is not None
            job.state = "succeeded"
            outputs.register_outputs(ctx, session, job, finished)
    labels = sorted((v.project, v.name, v.version) for v in models.list_versions(ctx))
    assert labels == [("a", "shared", 1), ("a", "shared", 2), ("b", "shared", 1)]
    models.promote(ctx, "a/shared:1", "production")
    models.promote(ctx, "b/shared:1", "production")  # b's production never archives a's
    assert {(v.project, v.version): v.stage for v in models.list_versions(ctx)}[("a", 1)] == "production"
    with pytest.raises(Conflict, match="several projects you can see: a, b"):
        models.lineage(ctx, "shared:1")

    spec = validate_job_spec(spec_dict(name="tuned", project="b") | {"model": {"version": "shared"}})
    with ctx.db.read() as session:
        assert model_sources.pinned(ctx, session, spec).model.version == "b/shared:1"

    for user, project, role in (("bea", "b", "maintainer"), ("ann", "a", "viewer")):
        accounts.create_user(ctx, user, "a long enough passphrase")
        rbac.grant(ctx, project, user, role)
    bea = ctx.acting_as(audit.Actor(name="bea", source="test"))
    assert models.lineage(bea, "shared:1").model == "b/shared:1"  # the one project she sees
    answers = []
    for ref in ("a/shared:1", "a/ghost:1"):  # a's model and no model at all
        with pytest.raises(NotFound) as missing:
            models.promote(bea, ref, "archived")
        answers.append((missing.value.message.replace(ref, "REF"), missing.value.hint))
    assert answers[0] == answers[1]
    ann = ctx.acting_as(audit.Actor(name="ann", source="test"))
    with pytest.raises(Forbidden):  # a viewer sees a's model, and may not promote it
        models.promote(ann, "a/shared:1", "archived")


def test_the_nodes_count_every_jobs_devices_but_name_only_the_jobs_the_caller_sees(
    ctx: ServiceContext,
) -> None:
    from shipyard.db import Attempt, Job
    from shipyard.services.accounts import accounts, rbac
    from shipyard.services.cluster import cluster

    view = jobs.submit(ctx, validate_job_spec(spec_dict(name="secret", project="other")))
    with ctx.db.transaction() as session:
        job = session.get(Job, view.id)
        assert job is not None
        job.state = "running"
        session.add(Attempt(job_id=view.id, number=1, state="running", accelerator_type="cpu",
                            device_ids=[0], threads_per_process=1, log_path="/dev/null"))  # fmt: skip
    accounts.create_user(ctx, "nia", "a long enough passphrase")
    rbac.grant(ctx, "mine", "nia", "member")
    nia = ctx.acting_as(audit.Actor(name="nia", source="test"))
    [seen_by_admin], [seen_by_nia] = cluster.list_nodes(ctx), cluster.list_nodes(nia)
    assert seen_by_admin.jobs == [view.id] and seen_by_nia.jobs == []
    assert seen_by_nia.used == seen_by_admin.used == {"cpu": 1}  # the devices are in use all the same


def test_a_launch_that_fails_for_a_passing_cause_waits_and_one_that_cannot_start_fails(
    ctx: ServiceContext,
) -> None:
    """The engine's refusals stand at the executor's seam: this machine's executor, told to fail
    its launches as Ray does when nodes are not reserved in time, and as a missing runtime does."""
    from shipyard.errors import LaunchFailed
    from shipyard.executors.local import LocalExecutor

    refusals = [
        LaunchFailed("Ray did not reserve nodes n1 within 60s", transient=True),
        LaunchFailed("could not start the training process", transient=False, hint="install it"),
    ]

    class Refusing(LocalExecutor):
        def launch(self, *args: object, **kwargs: object) -> NoReturn:
            raise refusals.pop(0)

    ctx.__dict__["executor"] = Refusing(ctx.devices())
    view = jobs.submit(ctx, validate_job_spec(spec_dict()))
    agent.tick(ctx, "agent-1")
    waiting = jobs.get(ctx, view.id)
    assert waiting.state == "queued" and waiting.pending_code == "unplaceable"
    assert waiting.pending_reason == "Ray did not reserve nodes n1 within 60s; tried again in 30s"
    agent.tick(ctx, "agent-1")  # backing off: not launched again yet
    assert len(refusals) == 1
    with ctx.db.transaction() as session:
        session.get_one(Job, view.id).restart_at = None
    agent.tick(ctx, "agent-1")
    failed = jobs.get(ctx, view.id)
    assert failed.state == "failed" and failed.attempts == [] and not refusals
    assert (failed.message, failed.hint) == ("could not start the training process", "install it")


def test_a_server_sees_a_cluster_through_the_nodes_its_agent_recorded(tmp_path: Path) -> None:
    """The server of a cluster never joins the engine (a process that joins a Ray cluster dies
    with its head): it lists the nodes and checks requests against what the agent recorded.
    The nodes are built here, as an engine would report them (the seam for absent H100s)."""
    from shipyard.agent import telemetry
    from shipyard.executors.base import NodeInventory, Request
    from shipyard.hardware.discovery import Device
    from shipyard.hardware.probe import HostRates

    def node(name: str, *, up: bool = True) -> NodeInventory:
        h100 = [
            Device(accelerator_type="h100-sxm", index=i, name="H100", vendor="nvidia", memory_gib=80.0,
                   peak_bf16_tflops=989.0, peak_fp32_tflops=67.0, nvlink_peers=(1 - i,))
            for i in range(2)
        ]  # fmt: skip
        cpu = Device(accelerator_type="cpu", index=0, name="Xeon", vendor="intel", memory_gib=64.0,
                     peak_bf16_tflops=1.0, peak_fp32_tflops=1.0, cores=16)  # fmt: skip
        return NodeInventory(id=name, devices=(*h100, cpu), labels={"rack": "r1"}, up=up,
                             host=HostRates(gemm_gflops_per_thread=10.0, memory_gb_per_s_per_thread=5.0,
                                           op_overhead_us=20.0))  # fmt: skip

    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", executor="ray")
    agent_ctx = open_context(settings)
    server_ctx = open_context(settings, inventory_from_agent=True)
    try:
        assert (
            "no node of the ray cluster is known yet"
            in server_ctx.inventory.check_feasible(Request(accelerator_types=["h100-sxm"], devices=1)).message
        )  # type: ignore[union-attr]
        recorded = [node("n1"), node("n2"), node("n3", up=False)]
        telemetry.record_inventory(agent_ctx, recorded)
        server_ctx.inventory._cache = (-1.0, [])  # type: ignore[attr-defined]  # past its 1 s
        assert list(server_ctx.inventory.known_nodes()) == recorded  # the same values, read back
        assert [n.id for n in server_ctx.inventory.nodes()] == ["n1", "n2"]
        assert (
            server_ctx.inventory.check_feasible(Request(accelerator_types=["h100-sxm"], devices=2, nodes=3))
            is None
        )
        refused = server_ctx.inventory.check_feasible(Request(accelerator_types=["h100-sxm"], devices=4))
        assert refused is not None and "n1 has 2, n2 has 2, n3 has 2" in refused.message
        telemetry.record_inventory(agent_ctx, recorded[:1])  # the engine forgot two nodes
        server_ctx.inventory._cache = (-1.0, [])  # type: ignore[attr-defined]
        assert [n.id for n in server_ctx.inventory.known_nodes()] == ["n1"]
        assert "executor" not in server_ctx.__dict__  # it never made (nor joined) the engine
    finally:
        agent_ctx.close()
        server_ctx.close()
