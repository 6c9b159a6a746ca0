"""The artifact store on replicated local roots: real files, a real database, real crashes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from shipyard.audit import Actor
from shipyard.db import StoredArtifact, StoredBlob, StoredEntry
from shipyard.errors import Conflict, CorruptData, Forbidden, InvalidSpec, NotFound, StorageError
from shipyard.services.accounts import accounts, rbac
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.storage import manifests, scrubber, upkeep
from shipyard.services.storage import storage as store
from shipyard.settings import Settings
from shipyard.storage import config as storage_config
from shipyard.storage.config import S3Config
from tests.conftest import Cli

pytestmark = pytest.mark.integration


@pytest.fixture
def ctx(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceContext]:
    """A store with three roots in three racks."""
    monkeypatch.delenv("SHIPYARD_STORAGE_KEY", raising=False)
    home = tmp_path / "home"
    context = open_context(Settings(home=home, db_url=db_url))
    for i in range(3):
        upkeep.add_root(context, tmp_path / f"root{i}", rack=f"rack{i}", node=None, disk=None)
    yield context
    context.close()


def _roots(ctx: ServiceContext) -> list[Path]:
    return [root.path for root in storage_config.load(ctx.settings.home).roots]


def _replica_files(ctx: ServiceContext, blob_name: str) -> list[Path]:
    return [root / blob_name for root in _roots(ctx) if (root / blob_name).is_file()]


def test_files_and_folders_round_trip_and_unchanged_shards_are_stored_once(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "step-100"
    (checkpoint / "shards").mkdir(parents=True)
    shards = {f"shards/{i}.bin": os.urandom(300_000 + i) for i in range(4)}
    for path, data in shards.items():
        (checkpoint / path).write_bytes(data)
    (checkpoint / "meta.json").write_text('{"step": 100}')
    first = store.put(ctx, checkpoint, "checkpoints/run/step-100", replicas=2)
    assert (first.kind, first.files, first.replicas) == ("folder", 5, 2)

    (checkpoint / "meta.json").write_text('{"step": 200}')  # one file changed, the shards did not
    store.put(ctx, checkpoint, "checkpoints/run/step-200", replicas=2)
    with ctx.db.transaction() as session:
        assert len(session.scalars(select(StoredBlob)).all()) == 6

    out = tmp_path / "restored"
    store.get(ctx, "checkpoints/run/step-100", out)
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == {
        **shards,
        "meta.json": b'{"step": 100}',
    }
    # Plain blobs are plain files named by their digest, each in two racks.
    with ctx.db.transaction() as session:
        blob = session.scalars(select(StoredBlob).where(StoredBlob.size_bytes == 300_000)).one()
    copies = _replica_files(ctx, blob.name)
    assert len(copies) == 2 and all(c.read_bytes() == shards["shards/0.bin"] for c in copies)
    assert upkeep.status(ctx).artifacts == 2


def test_encrypted_artifacts_read_back_and_survive_key_rotation(ctx: ServiceContext, tmp_path: Path) -> None:
    secret = os.urandom(9 << 20)  # three chunks of the envelope
    (tmp_path / "weights.bin").write_bytes(secret)
    stored = store.put(ctx, tmp_path / "weights.bin", "models/secret", encrypt=True, replicas=3)
    assert stored.encrypted
    with ctx.db.transaction() as session:
        blob = session.scalars(select(StoredBlob)).one()
    for copy in _replica_files(ctx, blob.name):
        assert secret[:4096] not in copy.read_bytes()  # nothing of the plaintext on disk
    rotated = upkeep.rotate_key(ctx)
    assert rotated["rewrapped"] == 1
    store.get(ctx, "models/secret", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == secret


@pytest.mark.slow
def test_scrub_repairs_every_blob_after_losing_and_corrupting_replicas(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    rng = random.Random(7)
    source = tmp_path / "src"
    source.mkdir()
    originals = {}
    for i in range(300):
        data = rng.randbytes(rng.randint(1, 40_000))
        (source / f"a{i}.bin").write_bytes(data)
        store.put(ctx, source / f"a{i}.bin", f"many/a{i}", replicas=3)
        originals[f"many/a{i}"] = data
    with ctx.db.transaction() as session:
        names = list(session.scalars(select(StoredBlob.name)))
    assert len(names) == 300
    for n, name in enumerate(names):
        copies = _replica_files(ctx, name)
        assert len(copies) == 3
        copies[0].unlink()  # one replica of every blob gone
        if n % 5 == 0:  # another replica of 20 % of them damaged
            damaged = bytearray(copies[1].read_bytes())
            damaged[len(damaged) // 2] ^= 0xFF
            copies[1].write_bytes(bytes(damaged))
    found = upkeep.scrub(ctx, repair=False)
    assert (found.checked, found.missing, found.corrupt, found.lost) == (300, 300, 60, 0)

    repaired = upkeep.scrub(ctx, repair=True)
    assert (repaired.repaired, repaired.lost) == (360, 0)
    clean = upkeep.scrub(ctx, repair=False)
    assert (clean.missing, clean.corrupt, clean.lost) == (0, 0, 0)
    for name, data in originals.items():
        store.get(ctx, name, tmp_path / "out.bin", force=True)  # the same file, read back each time
        assert (tmp_path / "out.bin").read_bytes() == data


def test_a_corrupt_replica_is_skipped_and_a_fully_corrupt_blob_never_returns_bytes(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    data = os.urandom(5 << 20)
    (tmp_path / "x.bin").write_bytes(data)
    store.put(ctx, tmp_path / "x.bin", "x", replicas=2)
    with ctx.db.transaction() as session:
        blob = session.scalars(select(StoredBlob)).one()
    first, second = _replica_files(ctx, blob.name)
    first.write_bytes(first.read_bytes()[:-1] + b"\0")
    store.get(ctx, "x", tmp_path / "ok.bin")
    assert (tmp_path / "ok.bin").read_bytes() == data
    # The read repaired what it met, perhaps onto another root: both copies as they are now.
    first, second = _replica_files(ctx, blob.name)
    first.write_bytes(first.read_bytes()[:-1] + b"\0")
    second.write_bytes(second.read_bytes()[: 1 << 20])  # truncated
    with pytest.raises(CorruptData, match="no replica holds the right bytes"):
        store.get(ctx, "x", tmp_path / "bad.bin")
    assert not (tmp_path / "bad.bin").exists()  # nothing half-written left for the caller


def test_bad_input_is_refused_and_changes_nothing(ctx: ServiceContext, tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"payload")
    store.put(ctx, tmp_path / "f.bin", "keep")
    for name in ("../escape", "/abs", "a\x07b", "a/./b"):
        with pytest.raises(InvalidSpec, match="artifact name"):
            store.put(ctx, tmp_path / "f.bin", name)
    with pytest.raises(NotFound, match="does not exist"):
        store.put(ctx, tmp_path / "missing.bin", "new")
    with pytest.raises(Conflict, match="exists already"):
        store.put(ctx, tmp_path / "f.bin", "keep")
    with pytest.raises(StorageError, match="4 replicas asked for, but the store has 3 root"):
        store.put(ctx, tmp_path / "f.bin", "too-many", replicas=4)
    # A manifest naming a blob that vanished from every root: named, with the cause.
    with ctx.db.transaction() as session:
        blob = session.scalars(select(StoredBlob)).one()
    for copy in _replica_files(ctx, blob.name):
        copy.unlink()
    with pytest.raises(NotFound, match=f"blob {blob.name}.*missing from every root"):
        store.get(ctx, "keep", tmp_path / "out.bin")
    assert [a.name for a in store.list_artifacts(ctx)] == ["keep"]


def test_a_wrong_master_key_is_named_as_such(
    ctx: ServiceContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f.bin").write_bytes(b"secret")
    store.put(ctx, tmp_path / "f.bin", "enc", encrypt=True)
    monkeypatch.setenv("SHIPYARD_STORAGE_KEY", "A" * 43 + "=")
    with pytest.raises(CorruptData, match=r"wrapped with master key .* which this keyring lacks"):
        store.get(ctx, "enc", tmp_path / "out.bin")


def test_an_unreachable_s3_endpoint_is_a_clear_error(ctx: ServiceContext, tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    config = storage_config.StorageConfig(
        backend="s3",
        # Two attempts, not the default six: the backoff between them is all this test would wait on.
        s3=S3Config(
            endpoint_url="http://127.0.0.1:9", bucket="b", access_key="k", secret_key="s", max_attempts=2
        ),
    )
    storage_config.save(ctx.settings.home, config)
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"S3 endpoint http://127.0.0.1:9 unreachable"):
        store.put(ctx, tmp_path / "f.bin", "nowhere")
    assert store.list_artifacts(ctx) == []


def test_quota_per_project(ctx: ServiceContext, tmp_path: Path) -> None:
    config = storage_config.load(ctx.settings.home)
    config.projects["small"] = storage_config.ProjectStorage(quota_gib=1 / 1024)  # 1 MiB
    storage_config.save(ctx.settings.home, config)
    (tmp_path / "a.bin").write_bytes(os.urandom(700_000))
    store.put(ctx, tmp_path / "a.bin", "a", project="small")
    with pytest.raises(Conflict, match="storage quota"):
        store.put(ctx, tmp_path / "a.bin", "b", project="small")


def test_roles_decide_who_reads_writes_and_deletes(ctx: ServiceContext, tmp_path: Path) -> None:
    for name in ("mia", "val", "out"):
        accounts.create_user(ctx, name, password="a long enough password")
    rbac.grant(ctx, "vision", "mia", "member")
    rbac.grant(ctx, "vision", "val", "viewer")
    (tmp_path / "f.bin").write_bytes(b"data")
    member, viewer, outsider = (ctx.acting_as(Actor(name=n, source="test")) for n in ("mia", "val", "out"))
    store.put(member, tmp_path / "f.bin", "d", project="vision")
    store.get(member, "d", tmp_path / "m.bin", project="vision")
    for who in (viewer, outsider):
        with pytest.raises(Forbidden):
            store.get(who, "d", tmp_path / "v.bin", project="vision")
    with pytest.raises(Forbidden):
        store.delete(member, "d", project="vision")  # maintainers and owners delete
    with pytest.raises(Forbidden):
        upkeep.scrub(member, repair=True)  # upkeep is the cluster admin's
    assert [a.name for a in store.list_artifacts(outsider)] == []
    store.delete(ctx, "d", project="vision")


def test_gc_frees_unreferenced_blobs_and_leftovers_after_the_grace_period(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    (tmp_path / "a.bin").write_bytes(os.urandom(1000))
    store.put(ctx, tmp_path / "a.bin", "a")
    leftover = _roots(ctx)[0] / "tmp" / "deadbeef"
    leftover.parent.mkdir(exist_ok=True)
    leftover.write_bytes(b"half a blob from a killed writer")
    store.delete(ctx, "a")
    assert upkeep.gc(ctx).blobs_removed == 0  # within the default grace period
    os.utime(leftover, (time.time() - 10, time.time() - 10))
    report = upkeep.gc(ctx, grace_s=0)
    assert (report.blobs_removed, report.bytes_freed, report.orphans_removed) == (1, 1000, 1)
    assert not leftover.exists() and upkeep.status(ctx).blobs == 0


def test_adding_a_rack_spreads_copies_and_removing_a_root_moves_them_off(tmp_path: Path, db_url: str) -> None:
    context = open_context(Settings(home=tmp_path / "home", db_url=db_url))
    for i in range(2):
        upkeep.add_root(context, tmp_path / f"same{i}", rack="a", node=None, disk=None)
    for i in range(20):
        (tmp_path / "f.bin").write_bytes(os.urandom(2000))
        store.put(context, tmp_path / "f.bin", f"f{i}", replicas=2)
    moved = upkeep.add_root(context, tmp_path / "other", rack="b", node=None, disk=None)
    assert moved.repaired == 20  # each blob gets its copy in rack b
    assert len(list((tmp_path / "other").rglob("blobs/*/*"))) == 20
    before = sum(1 for _ in (tmp_path / "same0").rglob("blobs/*/*")) + sum(
        1 for _ in (tmp_path / "same1").rglob("blobs/*/*")
    )
    assert before == 20  # and drops the second copy it had in rack a
    upkeep.remove_root(context, tmp_path / "same0")
    assert len(storage_config.load(context.settings.home).roots) == 2
    assert not list((tmp_path / "same0").rglob("blobs/*/*"))
    assert upkeep.scrub(context, repair=False).missing == 0
    context.close()


def test_a_full_root_fails_the_write_naming_it_and_leaves_the_rest(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        context = open_context(Settings(home=tmp_path / "home", db_url=f"sqlite:///{tmp_path / 'db'}"))
        upkeep.add_root(context, small, rack="only", node=None, disk=None)
        (tmp_path / "ok.bin").write_bytes(os.urandom(500_000))
        store.put(context, tmp_path / "ok.bin", "fits", replicas=1)
        (tmp_path / "big.bin").write_bytes(os.urandom(3 << 20))
        with pytest.raises(StorageError, match=rf"root {small} .*no space left on the device"):
            store.put(context, tmp_path / "big.bin", "too-big", replicas=1)
        assert [a.name for a in store.list_artifacts(context)] == ["fits"]
        store.get(context, "fits", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "ok.bin").read_bytes()
        assert not list((small / "tmp").iterdir())  # the failed write left nothing behind
        context.close()
    finally:
        subprocess.run(["umount", str(small)], check=False)


_WRITER = """
import sys
from pathlib import Path
from shipyard.services.storage import storage
from shipyard.services.context import open_context
storage.put(open_context(), Path(sys.argv[1]), sys.argv[2], replicas=3)
print("done", flush=True)
"""


@pytest.mark.slow
def test_writers_killed_at_random_points_leave_whole_artifacts_or_none(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    for i in range(3):
        cli.run("storage", "roots", "add", str(tmp_path / f"r{i}"), "--rack", f"rack{i}")
    source = tmp_path / "ckpt"
    source.mkdir()
    rng = random.Random(11)
    for i in range(6):
        (source / f"shard{i}").write_bytes(rng.randbytes(2 << 20))

    def write(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(source), name],
            env=cli.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    # Kill points relative to one whole write on this machine (interpreter start included), so
    # that kills land before and after commits however fast the machine runs today.
    started = time.monotonic()
    assert write("whole").communicate()[0] == b"done\n"
    whole_s = time.monotonic() - started
    completed = 0
    trials = 50
    for trial in range(trials):
        writer = write(f"ckpt/{trial}")
        time.sleep(rng.uniform(0.2, 1.2) * whole_s)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        completed += writer.stdout.read() == b"done\n" if writer.stdout else 0
        if writer.stdout:
            writer.stdout.close()
    listed = {a["name"] for a in cli.json("storage", "ls")} - {"whole"}
    assert 0 < len(listed) < trials, "the kills should land both before and after commits"
    for name in listed:
        out = tmp_path / "out" / name.replace("/", "-")
        cli.run("storage", "get", name, str(out))
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in source.iterdir())
        assert all((out / p.name).read_bytes() == p.read_bytes() for p in source.iterdir())
        shutil.rmtree(out)
    report = json.loads(cli.run("storage", "scrub", "--json").stdout)
    assert (report["corrupt"], report["missing"], report["lost"]) == (0, 0, 0)
    assert completed <= len(listed)


def test_cli_contract(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    for i in range(2):
        cli.run("storage", "roots", "add", str(tmp_path / f"r{i}"), "--rack", f"rack{i}", "--node", f"n{i}")
    (tmp_path / "f.bin").write_bytes(os.urandom(100_000))
    put = cli.json(
        "storage", "put", str(tmp_path / "f.bin"), "data/f", "--project", "p", "--replicas", "2", "--encrypt"
    )
    assert (put["project"], put["name"], put["replicas"], put["encrypted"]) == ("p", "data/f", 2, True)
    cli.run("storage", "get", "data/f", str(tmp_path / "back.bin"), "--project", "p")
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "f.bin").read_bytes()
    scrub = json.loads(cli.run("storage", "scrub", "--repair", "--json").stdout)
    assert {"checked", "corrupt", "missing", "repaired", "lost"} <= scrub.keys() and scrub["checked"] == 1
    status = cli.json("storage", "status")
    assert [(r["rack"], r["node"]) for r in status["roots"]] == [("rack0", "n0"), ("rack1", "n1")]
    assert all(r["free_bytes"] > 0 for r in status["roots"]) and (status["artifacts"], status["bytes"]) == (
        1,
        100_000,
    )
    # free_bytes moves with everything else writing to the disk between the two calls
    listed = json.loads(cli.run("storage", "roots", "ls", "--json").stdout)
    assert [r | {"free_bytes": 0} for r in listed] == [r | {"free_bytes": 0} for r in status["roots"]]
    assert all(r["free_bytes"] > 0 for r in listed)
    assert str(tmp_path / "r1") in cli.run("storage", "roots", "ls").stdout
    bad = cli.run("storage", "put", str(tmp_path / "f.bin"), "../../etc/x", check=False)
    assert bad.returncode == 1 and "Error:" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli.run("storage", "get", "nope", str(tmp_path / "x"), check=False)
    assert missing.returncode == 1 and "no artifact default/nope" in missing.stderr


def test_the_background_scrubber_repairs_every_replica_and_resumes_where_it_stopped(
    ctx: ServiceContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.bin").write_bytes(os.urandom(50_000 + i))
        store.put(ctx, tmp_path / f"f{i}.bin", f"many/f{i}", replicas=2)
    with ctx.db.transaction() as session:
        names = sorted(session.scalars(select(StoredBlob.name)))
    for n, name in enumerate(names):
        first = _replica_files(ctx, name)[0]
        if n % 2:
            first.unlink()
        else:
            first.write_bytes(b"bit rot" + first.read_bytes()[7:])
    config = storage_config.load(ctx.settings.home)
    config.scrub.rate_mb_s, config.scrub.light_interval_s = 1000.0, 0  # the deep pass alone
    storage_config.save(ctx.settings.home, config)
    monkeypatch.setattr(scrubber, "BATCH", 2)
    stopping = threading.Event()
    scrubber.scrub_some(ctx, stopping)  # the first two blobs; then the process "restarts"
    assert scrubber.last_pass(ctx).cursor == names[1]
    while scrubber.scrub_some(ctx, stopping) == 0.0 and scrubber.last_pass(ctx).started_at:
        pass
    done = scrubber.last_pass(ctx)
    assert done.finished_at and done.cursor == ""
    assert (done.tally["checked"], done.tally["repaired"], done.tally["lost"]) == (5, 5, 0)
    clean = upkeep.scrub(ctx, repair=False)
    assert (clean.missing, clean.corrupt) == (0, 0)
    # The next pass waits out scrub.interval_h (a week by default).
    assert scrubber.scrub_some(ctx, stopping) == scrubber.IDLE_LOOK_S
    assert upkeep.status(ctx).background_scrub["tally"]["repaired"] == 5


def test_a_read_repairs_what_it_found_damaged_and_owes_the_store_a_deep_pass_at_once(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    from shipyard.services.storage import health as store_health
    from shipyard.storage.opening import open_store
    from shipyard.storage.roots import placement

    (tmp_path / "w.bin").write_bytes(os.urandom(30_000))
    store.put(ctx, tmp_path / "w.bin", "rot/w", replicas=2)
    with ctx.db.transaction() as session:
        [name] = session.scalars(select(StoredBlob.name)).all()
    roots = open_store(ctx.settings.home).backend.roots  # type: ignore[attr-defined]
    first = next(r.file(name) for r in placement(roots, name, len(roots)) if r.file(name).is_file())
    first.write_bytes(b"bit rot" + first.read_bytes()[7:])  # the copy a read tries first
    store.get(ctx, "rot/w", tmp_path / "back.bin")  # served from the good copy...
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "w.bin").read_bytes()
    clean = upkeep.scrub(ctx, repair=False)  # ...and the bad one rewritten after it
    assert (clean.corrupt, clean.missing) == (0, 0)
    owed = store_health.owed(ctx.settings.home)
    assert owed is not None and owed.deep  # its root may hold more: every copy is read again now
    config = storage_config.load(ctx.settings.home)
    config.scrub.rate_mb_s = 1000.0
    storage_config.save(ctx.settings.home, config)
    stopping = threading.Event()
    scrubber.scrub_some(ctx, stopping)  # the light pass (due at once), then the deep one, not in a week
    while scrubber.scrub_some(ctx, stopping) == 0.0 and scrubber.last_pass(ctx).started_at:
        pass
    assert scrubber.last_pass(ctx).finished_at is not None
    assert store_health.owed(ctx.settings.home) is None


def test_a_blob_lost_for_good_neither_starves_the_deep_pass_nor_restarts_it_forever(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    """Two faults on one blob's two copies lose it; the scrubber reports it once and still
    repairs the rest: a deep pass owed for rot elsewhere runs to its end (light passes that
    re-owed one for the lost blob used to run back to back, and the deep pass never began)."""
    from shipyard.services.storage import health as store_health

    for i in range(2):
        (tmp_path / f"b{i}.bin").write_bytes(os.urandom(30_000 + i))
        store.put(ctx, tmp_path / f"b{i}.bin", f"pair/b{i}", replicas=2)
    with ctx.db.transaction() as session:
        lost, rotting = sorted(
            session.scalars(select(StoredEntry.blob_name).join(StoredArtifact).order_by(StoredArtifact.name))
        )
    for copy in _replica_files(ctx, lost):
        copy.unlink()
    bad = _replica_files(ctx, rotting)[0]
    bad.write_bytes(b"bit rot" + bad.read_bytes()[7:])
    store_health.owe(ctx.settings.home, deep=True)  # as a read that met the rot does
    config = storage_config.load(ctx.settings.home)
    config.scrub.rate_mb_s = 1000.0
    storage_config.save(ctx.settings.home, config)
    stopping = threading.Event()
    for _ in range(20):
        scrubber.scrub_some(ctx, stopping)
        if scrubber.last_pass(ctx).finished_at is not None:
            break
    done = scrubber.last_pass(ctx)
    assert done.finished_at is not None, done  # the deep pass ran to its end
    assert (done.tally["repaired"], done.tally["lost"]) == (1, 1)
    assert store_health.owed(ctx.settings.home) is None  # and nothing owes another at once
    check = upkeep.scrub(ctx, repair=False)
    assert (check.corrupt, check.missing, check.lost) == (0, 2, 1)  # the lost one's two copies


def test_when_the_process_that_scrubs_dies_another_carries_on(ctx: ServiceContext, tmp_path: Path) -> None:
    """The scrub lock is held (by an agent, say); the server's scrubber waits for it rather than
    giving up, and repairs once the holder is gone."""
    import fcntl

    (tmp_path / "c.bin").write_bytes(os.urandom(20_000))
    store.put(ctx, tmp_path / "c.bin", "taken/c", replicas=2)
    with ctx.db.transaction() as session:
        [name] = session.scalars(select(StoredBlob.name)).all()
    _replica_files(ctx, name)[0].unlink()
    stopping = threading.Event()
    with open(ctx.settings.home / scrubber.LOCK_FILE, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        waiting = threading.Thread(target=scrubber.scrub_in_background, args=(ctx, stopping))
        waiting.start()
        time.sleep(2 * scrubber.TAKE_OVER_S)
        assert len(_replica_files(ctx, name)) == 1  # the holder scrubs, not this one
    # The holder is gone (its lock file closed, as a killed process's is).
    try:
        deadline = time.monotonic() + 60
        while len(_replica_files(ctx, name)) < 2:
            assert time.monotonic() < deadline, "the waiting scrubber never took over"
            time.sleep(0.2)
    finally:
        stopping.set()
        waiting.join()


def test_a_replaced_disk_is_refilled_by_the_background_scrubber_manifests_included(
    ctx: ServiceContext, tmp_path: Path
) -> None:
    for i in range(4):
        (tmp_path / f"f{i}.bin").write_bytes(os.urandom(20_000 + i))
        store.put(ctx, tmp_path / f"f{i}.bin", f"disk/f{i}", replicas=2)
    config = storage_config.load(ctx.settings.home)
    config.scrub.rate_mb_s = 1000.0
    storage_config.save(ctx.settings.home, config)
    # The fullest root's disk dies and an empty one takes its place.
    fullest = max(_roots(ctx), key=lambda root: sum(1 for p in root.rglob("*") if p.is_file()))
    shutil.rmtree(fullest)
    fullest.mkdir()
    before = upkeep.scrub(ctx, repair=False)
    assert before.missing > 0 and before.manifests_missing > 0 and before.lost == 0
    status = upkeep.status(ctx)
    assert status.missing_copies == before.missing and status.time_to_whole_s is not None
    scrubber.scrub_some(ctx, threading.Event())  # the light pass, due at once: no week to wait
    assert upkeep.status(ctx).missing_copies == 0
    after = upkeep.scrub(ctx, repair=False)
    assert (after.missing, after.corrupt, after.lost, after.manifests_missing) == (0, 0, 0, 0)
    # Every manifest has its two copies again: a second root lost now still leaves a catalog to
    # rebuild from the third.
    with ctx.db.transaction() as session:
        names = [manifests.name_of(a.project, a.name) for a in session.scalars(select(StoredArtifact))]
    assert all(len(_replica_files(ctx, name)) >= 2 for name in names)


def test_the_catalog_is_rebuilt_from_the_manifests_when_the_database_is_lost(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = open_context(Settings(home=home, db_url=f"sqlite:///{tmp_path / 'first.db'}"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("a")
    (tmp_path / "folder" / "b.txt").write_text("b")
    (tmp_path / "secret.bin").write_bytes(os.urandom(10_000))
    store.put(first, tmp_path / "folder", "kept/folder")
    store.put(first, tmp_path / "secret.bin", "kept/secret", encrypt=True)
    store.put(first, tmp_path / "secret.bin", "dropped")
    store.delete(first, "dropped")
    upkeep.gc(first, grace_s=0)  # the manifests of live artifacts are not leftovers
    first.close()

    # The database is gone; the store (and the home's master key) are not.
    lost = open_context(Settings(home=home, db_url=f"sqlite:///{tmp_path / 'fresh.db'}"))
    assert store.list_artifacts(lost) == []
    report = upkeep.recover(lost)
    assert (report.manifests, report.recovered, report.already_known, report.unreadable) == (2, 2, 0, [])
    store.get(lost, "kept/folder", tmp_path / "out")
    assert (tmp_path / "out" / "b.txt").read_text() == "b"
    store.get(lost, "kept/secret", tmp_path / "secret.out")
    assert (tmp_path / "secret.out").read_bytes() == (tmp_path / "secret.bin").read_bytes()
    assert upkeep.recover(lost).recovered == 0  # nothing twice
    assert upkeep.scrub(lost, repair=False).lost == 0
    lost.close()


def test_a_root_deleted_and_another_rotting_heal_while_a_server_runs(tmp_path: Path) -> None:
    """Nobody runs a scrub: one root's blobs deleted and a fifth of another's corrupted, the
    server's scrubber restores every copy (the light pass sees the missing ones at once, its
    check of a source finds the rot and starts a deep pass), and `storage status` says when."""
    from tests.conftest import Server

    home = tmp_path / "home"
    cli = Cli(home)
    for i in range(3):
        cli.run("storage", "roots", "add", str(tmp_path / f"root{i}"), "--rack", f"rack{i}")
    config = storage_config.load(home)
    config.replicas, config.scrub.light_interval_s = 3, 2.0
    storage_config.save(home, config)
    for i in range(10):
        (tmp_path / f"a{i}.bin").write_bytes(os.urandom(40_000 + i))
        cli.run("storage", "put", str(tmp_path / f"a{i}.bin"), f"heal/a{i}")
    server = Server(home, f"sqlite:///{home / 'shipyard.db'}", "correct horse battery staple")
    try:
        # The server's first deep pass (the store was never scrubbed) ends before the faults: a
        # pass under way could read a blob before its rot and finish without seeing it.
        first_pass = time.monotonic() + 60
        while not cli.json("storage", "status")["background_scrub"].get("finished_at"):
            assert time.monotonic() < first_pass, "the server's scrubber never finished a pass"
            time.sleep(0.5)
        gone = sorted(p for p in (tmp_path / "root0" / "blobs").rglob("*") if p.is_file())
        for blob in gone:
            blob.unlink()
        rotting = sorted(p for p in (tmp_path / "root1" / "blobs").rglob("*") if p.is_file())[:2]
        for blob in rotting:
            blob.write_bytes(b"bit rot" + blob.read_bytes()[7:])
        faulted = time.time()
        deadline = time.monotonic() + 120
        while True:
            status = cli.json("storage", "status")
            deep = status["background_scrub"]
            healed = (deep.get("finished_at") or 0) > faulted and not deep.get("started_at")
            if status["missing_copies"] == 0 and healed:
                break
            assert time.monotonic() < deadline, status
            time.sleep(1)
        print(f"store whole again {time.time() - faulted:.1f} s after the fault")
        check = cli.json("storage", "scrub")  # every copy read, nothing repaired by this
        assert (check["missing"], check["corrupt"], check["lost"]) == (0, 0, 0)
        assert all(blob.is_file() for blob in gone)
    finally:
        server.stop()
