"""The ceiling of the HTTP stack itself on this machine: how many job submissions per second
uvicorn + FastAPI + pydantic can take when the handler does nothing but validate the spec (no
authentication, no database, no audit), with the same clients as ``api_load.py``.

    .venv/bin/python benchmarks/api_floor.py [--requests 3000] [--clients 1,8] [--workers 2]

It puts ``api_load.py``'s figures in proportion: no submission path on this stack can be faster
than its empty handler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.api_load import KeptAlive, cpu_use, free_port, in_parallel  # noqa: E402
from tests.builders import spec_dict  # noqa: E402

APP = """
from typing import Any
from fastapi import FastAPI
from pydantic import BaseModel
from shipyard.schemas.jobspec import validate_job_spec

class Submission(BaseModel):
    spec: dict[str, Any]

app = FastAPI()

@app.get("/healthz")
def health() -> dict[str, str]:
    return {"status": "ok"}

@app.post("/api/v1/jobs", status_code=201)
def submit(body: Submission) -> dict[str, Any]:
    spec = validate_job_spec(body.spec)
    return {"id": spec.name, "spec": spec.model_dump(mode="json", by_alias=True)}
"""
SERVE = """
import sys
import uvicorn
from uvicorn.supervisors import Multiprocess
from shipyard.cli.server import _tcp_listener

sys.path.insert(0, sys.argv[3])
port, workers = int(sys.argv[1]), int(sys.argv[2])
config = uvicorn.Config(
    "floor_app:app", host="127.0.0.1", port=port, workers=workers, log_level="warning", access_log=False
)
Multiprocess(config, sockets=[_tcp_listener("127.0.0.1", port)]).run()
"""


def run(url: str, requests: int, clients: int, server: list[int]) -> dict[str, Any]:
    payload = json.dumps({"spec": spec_dict(name="load")}).encode()
    latencies: list[float] = []
    lock = threading.Lock()

    def client(count: int) -> None:
        with KeptAlive(url, {}) as connection:
            for _ in range(count):
                start = time.perf_counter()
                status, answer = connection.request("POST", "/api/v1/jobs", payload)
                if status != 201:
                    raise SystemExit(f"the empty handler answered {status}: {answer[:200]!r}")
                with lock:
                    latencies.append((time.perf_counter() - start) * 1000)

    before = cpu_use({"server": server})["server"]
    seconds = in_parallel(client, [requests // clients] * clients)
    used = cpu_use({"server": server})["server"] - before
    return {
        "server_cpu_ms": used / len(latencies) * 1000,
        "clients": clients,
        "per_s": len(latencies) / seconds,
        "p50_ms": statistics.median(latencies),
        "p99_ms": statistics.quantiles(latencies, n=100)[98],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    app_dir = Path(tempfile.mkdtemp())
    (app_dir / "floor_app.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), str(args.workers), str(app_dir)], env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        workers = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True)
        processes = [server.pid, *map(int, workers.stdout.split())]
        for clients in (int(c) for c in args.clients.split(",")):
            result = run(url, args.requests, clients, processes)
            print(
                f"empty handler, {clients} client(s): {result['per_s']:.0f} submissions/s "
                f"(p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms), "
                f"server CPU {result['server_cpu_ms']:.2f} ms per submission"
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(app_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
