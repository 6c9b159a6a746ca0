"""The artifact store on a real SeaweedFS cluster: 1 master, 3 volume servers in 3 racks, a filer
with the S3 gateway, replication 010; started on loopback from the `weed` binary."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from shipyard.db import StoredBlob
from shipyard.errors import DependencyMissing
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.storage import storage as store
from shipyard.services.storage import upkeep
from shipyard.settings import Settings
from shipyard.storage import config as storage_config
from shipyard.storage.blobs import Blob, BlobStore
from shipyard.storage.crypto import Keyring
from shipyard.storage.opening import open_store
from shipyard.storage.s3 import S3Objects
from tests.support.seaweedfs import SeaweedCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedCluster]:
    pytest.importorskip("boto3")
    try:
        running = SeaweedCluster(tmp_path_factory.mktemp("seaweedfs")).start()
    except DependencyMissing as exc:
        pytest.skip(str(exc))
    yield running
    running.stop()


@pytest.fixture
def ctx(tmp_path: Path, cluster: SeaweedCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceContext]:
    monkeypatch.delenv("SHIPYARD_STORAGE_KEY", raising=False)
    home = tmp_path / "home"
    prefix = f"{tmp_path.name}/"  # each test its own corner of the bucket
    s3 = cluster.s3.model_copy(update={"prefix": prefix})
    storage_config.save(home, storage_config.StorageConfig(backend="s3", s3=s3))
    context = open_context(Settings(home=home, db_url=f"sqlite:///{tmp_path / 'db'}"))
    yield context
    context.close()


def test_artifacts_round_trip_through_s3_with_multipart_encryption_and_dedup(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(os.urandom(40 << 20))  # three 16 MiB parts
    (folder / "meta.json").write_text('{"step": 7}')
    store.put(ctx, folder, "ckpt/7")
    store.put(ctx, folder, "ckpt/7-copy")  # same bytes: stored once
    store.put(ctx, folder / "weights.bin", "secret", encrypt=True)
    with ctx.db.transaction() as session:
        assert len(session.scalars(select(StoredBlob)).all()) == 3
    assert upkeep.status(ctx).roots[0]["reachable"] is True

    store.get(ctx, "ckpt/7", tmp_path / "back")
    assert (tmp_path / "back" / "weights.bin").read_bytes() == (folder / "weights.bin").read_bytes()
    store.get(ctx, "secret", tmp_path / "secret.bin")
    assert (tmp_path / "secret.bin").read_bytes() == (folder / "weights.bin").read_bytes()
    report = upkeep.scrub(ctx, repair=False)
    assert (report.checked, report.corrupt, report.lost) == (3, 0, 0)
    assert report.bytes_verified > 80 << 20
    store.delete(ctx, "ckpt/7")
    store.delete(ctx, "ckpt/7-copy")
    assert upkeep.gc(ctx, grace_s=0).blobs_removed == 2
    backend = open_store(ctx.settings.home).backend
    left = sorted(name for name, _ in backend.objects())
    # Only the encrypted blob is left, and the manifest of its artifact (`storage recover`'s).
    assert [name.split("/")[0] for name in left] == ["enc", "manifests"]


def test_losing_a_volume_server_under_load_loses_nothing_and_seaweedfs_restores_replicas(
    cluster: SeaweedCluster, tmp_path: Path
) -> None:
    blobs = BlobStore(
        S3Objects(cluster.s3.model_copy(update={"prefix": "kill-test/"})), lambda: Keyring({}, "")
    )
    rng = random.Random(3)
    payloads = {}
    for i in range(12):
        path = tmp_path / f"before{i}"
        path.write_bytes(rng.randbytes(3 << 20))
        payloads[i] = (path, blobs.put_file(path, replicas=1, encrypt=False)[0])

    failures: list[str] = []
    reads = 0
    written: list[tuple[Path, Blob]] = []
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            _, blob = payloads[rng.randrange(len(payloads))]
            try:
                blobs.read(blob, blobs.verifier(blob))
                reads += 1
            except Exception as exc:  # every failed read is a finding
                failures.append(f"read {blob.name}: {exc}")

    def writer() -> None:
        for i in range(20):
            path = tmp_path / f"during{i}"
            path.write_bytes(os.urandom(2 << 20))
            try:
                written.append((path, blobs.put_file(path, replicas=1, encrypt=False)[0]))
            except Exception as exc:
                failures.append(f"write {path.name}: {exc}")

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    cluster.kill_volume(1)  # rack1 goes away mid-stream
    threads[1].join(timeout=300)
    time.sleep(2.0)
    stop.set()
    threads[0].join(timeout=60)

    assert failures == []
    assert reads > 0 and len(written) == 20
    for path, blob in [*payloads.values(), *written]:
        out = tmp_path / "check.bin"
        blobs.get_file(blob, out)
        assert out.read_bytes() == path.read_bytes()

    deadline = time.monotonic() + 60
    while cluster.racks_up() != {"rack2", "rack3"} and time.monotonic() < deadline:
        time.sleep(1)
    under = [v for v, racks in cluster.volume_replicas().items() if len(racks) < 2]
    assert under, "the lost server held copies, so some volumes must be under-replicated"
    output = cluster.shell("volume.fix.replication -apply")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        replicas = cluster.volume_replicas()
        if all(len(racks) >= 2 for racks in replicas.values()):
            break
        time.sleep(2)
    assert all(len(racks) >= 2 for racks in cluster.volume_replicas().values()), output
    assert all(racks <= {"rack2", "rack3"} for racks in cluster.volume_replicas().values())
