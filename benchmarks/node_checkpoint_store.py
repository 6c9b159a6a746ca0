"""A two-node checkpoint written into the artifact store by the nodes themselves, beside boto3's
own ``upload_file`` of the same files from the same nodes, in one run.

Each "node" is a process of its own holding its part of the checkpoint (the shards of its ranks,
as the runtime writes them). Shipyard: each node stores its part with ``FolderTransfer.write``
(the code a cluster node runs), hands its files' records to the agent (this process), which
commits the checkpoint into the catalog (``storage.commit_written``): timed from the first byte
to the committed artifact. boto3: each node uploads its files with ``upload_file`` (its default
transfer settings: 8 MiB parts, 10 threads). The store is a loopback SeaweedFS cluster (one
master, three volume servers keeping two copies, the S3 gateway). The cases alternate over
rounds; medians are reported, and the agent's peak RSS growth while it commits (it never holds a
byte of the checkpoint).

    .venv/bin/python benchmarks/node_checkpoint_store.py [--size-gib 1.5] [--rounds 3] [--json]

Target of the issue: checkpoint-written-to-committed >= 0.8x of boto3's ``upload_file``; the
agent's RSS grows by < 100 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the SeaweedFS harness is the tests' (tests/support)

from shipyard.services.context import open_context  # noqa: E402
from shipyard.services.storage import storage  # noqa: E402
from shipyard.settings import Settings  # noqa: E402
from shipyard.storage import config as storage_config  # noqa: E402
from shipyard.storage.config import S3Config  # noqa: E402
from shipyard.storage.transfer import FolderTransfer  # noqa: E402
from tests.support.seaweedfs import SeaweedCluster  # noqa: E402

NODES = 2
SHARDS_PER_NODE = 2
"""A 2-node job with 2 ranks a node: each rank's shard is a file, as the runtime writes them."""


def write_checkpoint(scratch: Path, size: int) -> list[Path]:
    """Each node's part of a checkpoint of ``size`` bytes of random data (shards do not compress)."""
    parts = []
    shard = size // (NODES * SHARDS_PER_NODE)
    block = os.urandom(1 << 20)
    for node in range(NODES):
        folder = scratch / f"node{node}" / "step_000010"
        folder.mkdir(parents=True)
        for rank in range(SHARDS_PER_NODE):
            with open(folder / f"__{node * SHARDS_PER_NODE + rank}_0.distcp", "wb") as f:
                for offset in range(0, shard, len(block)):
                    # Each MiB differs (a counter in front): no two blocks deduplicate.
                    f.write(offset.to_bytes(8, "little") + block[: min(len(block), shard - offset) - 8])
        if node == 0:
            (folder / "checkpoint.json").write_text(json.dumps({"step": 10}))
        parts.append(folder)
    return parts


def node_stores(mover: FolderTransfer, folder: str) -> list[dict[str, Any]]:
    return mover.write(Path(folder))


def node_uploads(s3: dict[str, Any], prefix: str, folder: str) -> int:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["endpoint_url"],
        aws_access_key_id=s3["access_key"],
        aws_secret_access_key=s3["secret_key"],
        region_name=s3["region"],
    )
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    for file in files:
        client.upload_file(str(file), s3["bucket"], f"{prefix}{file.name}")
    return len(files)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = int(args.size_gib * 2**30)
    scratch = Path(tempfile.mkdtemp(prefix="node-store-bench-"))
    slots = int(2 * args.rounds * args.size_gib * 1024 / 64) + 20
    cluster = SeaweedCluster(scratch / "seaweedfs", max_volumes=slots).start()
    try:
        parts = write_checkpoint(scratch / "checkpoint", size)
        home = scratch / "home"
        home.mkdir()
        figures: dict[str, list[float]] = {"shipyard": [], "boto3": []}
        growth = []
        with ProcessPoolExecutor(NODES) as nodes:
            for n in range(args.rounds):
                s3: S3Config = cluster.s3.model_copy(update={"prefix": f"round{n}/"})
                storage_config.save(home, storage_config.StorageConfig(backend="s3", s3=s3))
                ctx = open_context(Settings(home=home, db_url=f"sqlite:///{home / 'db.sqlite'}"))
                mover = storage.transfer_for(ctx, "default")
                cases = ["shipyard", "boto3"] if n % 2 == 0 else ["boto3", "shipyard"]
                for case in cases:
                    os.sync()
                    started = time.perf_counter()
                    if case == "shipyard":
                        before = rss_mb()
                        records = nodes.map(node_stores, [mover] * NODES, [str(p) for p in parts])
                        merged = [record for part in records for record in part]
                        storage.commit_written(
                            ctx, merged, f"jobs/bench/checkpoint/step-{n}", project="default", owner="bench"
                        )
                        growth.append(rss_mb() - before)
                    else:
                        prefixes = [f"round{n}/boto3/node{i}/" for i in range(NODES)]
                        list(nodes.map(node_uploads, [s3.model_dump()] * NODES, prefixes, map(str, parts)))
                    figures[case].append(size / (time.perf_counter() - started) / 1e9)
                ctx.close()
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    shipyard, boto = statistics.median(figures["shipyard"]), statistics.median(figures["boto3"])
    report = {
        "machine": f"{platform.node()} ({os.cpu_count()} cores)",
        "checkpoint_gib": args.size_gib,
        "nodes": NODES,
        "rounds": args.rounds,
        "shipyard_written_to_committed_gbps": figures["shipyard"],
        "boto3_upload_file_gbps": figures["boto3"],
        "ratio": shipyard / boto,
        "agent_rss_growth_mb": max(growth),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{args.size_gib:g} GiB checkpoint, {NODES} nodes x {SHARDS_PER_NODE} shards, SeaweedFS on loopback"
    )
    print(f"  nodes store it, agent commits   {shipyard:6.3f} GB/s  (rounds: {_listed(figures['shipyard'])})")
    print(f"  boto3 upload_file from the nodes {boto:6.3f} GB/s  (rounds: {_listed(figures['boto3'])})")
    print(f"  ratio {shipyard / boto:.2f}x (target >= 0.8x)")
    print(f"  agent peak RSS growth while committing: {max(growth):.1f} MB (target < 100 MB)")


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    main()
