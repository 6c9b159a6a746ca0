"""Where a fine-tuning job's base model comes from: a folder on the node, a folder in the artifact
store (``model.path: store:NAME``) or a registered model version (``model.version``). The stored
spec keeps the reference; the submit checks and each launch read a verified local copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from shipyard import registry
from shipyard.auth import Permission
from shipyard.errors import InvalidSpec
from shipyard.executors.base import StoredInput
from shipyard.schemas.jobspec import STORE_SCHEME, JobSpec, validate_job_spec
from shipyard.schemas.launch import MERGED_DIR
from shipyard.services.context import ServiceContext
from shipyard.services.models import models
from shipyard.services.storage import storage


@dataclass(frozen=True, slots=True)
class LocalModel:
    spec: JobSpec
    """The spec with ``model.path`` a folder on this node."""
    fetched: Path | None
    """The folder when it is a copy this node made (a root the job may read), else None."""


def pinned(ctx: ServiceContext, session: Session, spec: JobSpec) -> JobSpec:
    """At submit: ``model.version`` ``NAME`` becomes the ``PROJECT/NAME:VERSION`` it is now, so
    that a relaunch trains on the same weights; the caller must be allowed to download it. A
    name without a project is a model of the job's own project, never another's."""
    ref = spec.model.version
    if ref is None:
        return spec
    _, label = models.allowed_version(ctx, session, ref, Permission.MODEL_DOWNLOAD, project=spec.project)
    if label == ref:
        return spec
    return spec.model_copy(update={"model": spec.model.model_copy(update={"version": label})})


def local(ctx: ServiceContext, session: Session, spec: JobSpec, project: str) -> LocalModel:
    """The spec with its base model as a local folder, fetched (verified) when it is not one."""
    model = spec.model
    if model.version is not None:
        ref = models.ModelRef.parse(model.version)  # jobs pinned before names were per project: theirs
        found = registry.find(session, ref.project or project, ref.name, ref.version)
        folder = _weights_of(models.export_folder(ctx, session, found), model.version)
    elif model.path is not None and model.path.startswith(STORE_SCHEME):
        folder, _ = storage.materialize(
            ctx, model.path.removeprefix(STORE_SCHEME), project=project, session=session
        )
    else:
        return LocalModel(spec, None)
    document = spec.model_dump(mode="json", by_alias=True)
    document["model"] = {"path": str(folder)}
    return LocalModel(validate_job_spec(document), folder)


def for_nodes(ctx: ServiceContext, session: Session, spec: JobSpec, project: str) -> StoredInput | None:
    """The base model of a cluster attempt as its nodes fetch it from the store themselves
    (None: a folder the nodes have)."""
    model = spec.model
    if model.version is not None:
        ref = models.ModelRef.parse(model.version)
        found = registry.find(session, ref.project or project, ref.name, ref.version)
        export = found.artifact
        if export.written:  # its node stored it; the catalog may not have committed it yet
            files = storage.handed(ctx, export.written)
        elif export.stored_name:
            files = storage.node_input(ctx, session, export.stored_name, found.project)[0].files
        else:
            raise InvalidSpec(
                f"model version {model.version} is not in the artifact store, which the nodes read",
                hint="wait for the agent to commit it (`shipyard storage ls` lists it), then resubmit",
            )
        paths = {record["path"] for record in files}
        if "adapter_config.json" not in paths:
            return StoredInput(files)
        if f"{MERGED_DIR}/config.json" in paths:
            return StoredInput([r for r in files if r["path"].startswith(f"{MERGED_DIR}/")], MERGED_DIR)
        raise _adapters_only(model.version)
    if model.path is not None and model.path.startswith(STORE_SCHEME):
        return storage.node_input(ctx, session, model.path.removeprefix(STORE_SCHEME), project)[0]
    return None


def _weights_of(folder: Path, ref: str) -> Path:
    """A version's full weights: its export, or the merged model beside a version of adapters."""
    if not (folder / "adapter_config.json").is_file():
        return folder
    if (folder / MERGED_DIR / "config.json").is_file():
        return folder / MERGED_DIR
    raise _adapters_only(ref)


def _adapters_only(ref: str) -> InvalidSpec:
    return InvalidSpec(
        f"model version {ref} holds adapters without a merged model to train on",
        hint="fine-tune the base it was trained from, or train that version again with finetune.merge: true",
    )
