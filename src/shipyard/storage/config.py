"""The store's configuration: ``$SHIPYARD_HOME/storage.yaml``, written by ``shipyard storage roots``
and readable (and editable) by an operator::

    backend: local            # or s3
    replicas: 2               # default copies of every blob; per project below
    roots:                    # local disks or mounts, each tagged with its failure domains
      - {path: /data/a, rack: r1, node: n1, disk: a}
    s3: {endpoint_url: http://seaweed:8333, bucket: shipyard, access_key: K, secret_key: S}
    projects:
      vision: {replicas: 3, encrypt: true, quota_gib: 500}
    gc_grace_s: 86400         # unreferenced blobs younger than this are kept
    kms: mypackage.kms:open   # optional: a factory returning master keys (see crypto.MasterKeys)
    node_cache_gib: 100       # each cluster node's cache of stored datasets and base models
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shipyard.durable import write_atomically
from shipyard.errors import InvalidSpec

CONFIG_NAME = "storage.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


DomainLabel = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
"""A failure domain's name: a host name or a label, never text that would drive a terminal."""


class RootConfig(_Strict):
    path: Path
    rack: DomainLabel = "rack0"
    node: DomainLabel = Field(default_factory=lambda: socket.gethostname()[:63])
    disk: Annotated[str, Field(pattern=r"^([A-Za-z0-9][A-Za-z0-9._/-]{0,254})?$")] = ""
    """Empty: the root's own path stands for its disk."""

    def domains(self) -> tuple[str, str, str]:
        """(rack, node, disk), each qualified by the wider ones."""
        disk = self.disk or str(self.path)
        return self.rack, f"{self.rack}/{self.node}", f"{self.rack}/{self.node}/{disk}"


class S3Config(_Strict):
    endpoint_url: str
    bucket: str
    access_key: str | None = None
    secret_key: str | None = None
    region: str = "us-east-1"
    prefix: str = ""
    max_attempts: int = Field(default=6, ge=1, le=20)
    """Tries per request, with exponential backoff between them (botocore's standard mode)."""


class ProjectStorage(_Strict):
    replicas: int | None = Field(default=None, ge=1, le=16)
    encrypt: bool = False
    quota_gib: float | None = Field(default=None, gt=0)


class ScrubConfig(_Strict):
    """The background scrubber (``services.storage.scrubber``)."""

    interval_h: float = Field(default=168.0, ge=0, le=100_000)
    """Hours between the starts of two deep passes, which read every copy of every blob in full
    (default: weekly, as Ceph's deep scrub). Damage a read finds starts one at once."""
    light_interval_s: float = Field(default=60.0, ge=0, le=86_400)
    """Seconds between two light passes, which see that every copy exists and restore the
    missing ones from a checked copy (a root deleted or unmounted heals within about this long
    while a server or an agent runs); 0: none. Local roots only (an object store keeps its own)."""
    rate_mb_s: float = Field(default=64.0, gt=0, le=1_000_000)
    """Most MiB per second it reads or copies, so that training keeps the disks."""


class StorageConfig(_Strict):
    backend: Literal["local", "s3"] = "local"
    replicas: int = Field(default=2, ge=1, le=16)
    roots: list[RootConfig] = Field(default_factory=list)
    s3: S3Config | None = None
    projects: dict[str, ProjectStorage] = Field(default_factory=dict)
    gc_grace_s: float = Field(default=86400.0, ge=0)
    scrub: ScrubConfig = Field(default_factory=ScrubConfig)
    kms: str | None = None
    node_cache_gib: float = Field(default=100.0, ge=0)
    """The most a cluster node's cache of stored inputs (datasets, base models) holds before it
    evicts those no job on the node reads, least recently used first."""

    def project(self, name: str) -> ProjectStorage:
        return self.projects.get(name, ProjectStorage())

    def replicas_for(self, project: str, asked: int | None = None) -> int:
        return asked or self.project(project).replicas or self.replicas


def config_path(home: Path) -> Path:
    return home / CONFIG_NAME


def default_root(home: Path) -> RootConfig:
    """Where blobs go when no root was added: one directory in the home (one copy is all it holds)."""
    return RootConfig(path=home / "store", rack="local", disk="home")


def load(home: Path) -> StorageConfig:
    path = config_path(home)
    if not path.exists():
        return StorageConfig()
    try:
        return StorageConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise InvalidSpec(
            f"{path} is not a valid storage configuration: {_first_error(exc)}",
            hint="fix the file (its format is in `shipyard storage --help`), or remove it for the defaults",
        ) from exc


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
    return str(exc).splitlines()[0]


def save(home: Path, config: StorageConfig) -> None:
    text = yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    write_atomically(config_path(home), text.encode())
