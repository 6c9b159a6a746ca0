"""Device telemetry: the agent samples its node (the CPU from the real ``/proc``, the accelerators
through the vendor-query seam, since this machine has no GPU), and the samples read back per node
and per attempt's devices, averaged into time buckets."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from shipyard.agent import telemetry
from shipyard.db import Attempt, DeviceSample
from shipyard.hardware.telemetry import DeviceReading, parse_hl_smi, parse_rocm_smi, throttle_words
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.cluster import telemetry as device_telemetry
from shipyard.services.context import ServiceContext
from shipyard.services.jobs import jobs
from tests.builders import spec_dict
from tests.unit.conftest import TWO_CORES

GPUS = [  # what NVML would report for two busy H100s, the second throttled by heat (the seam)
    DeviceReading("0", utilization=0.97, memory_gib=61.0, power_w=690, temperature_c=71.0, clock_mhz=1980),
    DeviceReading("1", utilization=0.55, memory_gib=61.0, power_w=420.0, temperature_c=88.0, clock_mhz=1410.0,
                  throttle=throttle_words(0x40)),
]  # fmt: skip


def test_the_agent_samples_its_node_and_a_job_sees_its_devices(ctx: ServiceContext) -> None:
    ctx = dataclasses.replace(ctx, vendor_queries=dataclasses.replace(TWO_CORES, telemetry=lambda: GPUS))
    (node,) = [known.id for known in ctx.executor.known_nodes()]  # this machine
    telemetry._sampling.sampled_at = 0.0
    started = datetime.now(UTC) - timedelta(seconds=1)
    assert telemetry.sample_devices(ctx, ctx.executor.known_nodes()) == 3  # the host and two GPUs
    assert telemetry.sample_devices(ctx, ctx.executor.known_nodes()) == 0  # not again within 5 s
    time.sleep(0.3)
    telemetry._sampling.sampled_at = 0.0
    assert telemetry.sample_devices(ctx, ctx.executor.known_nodes()) == 3

    by_device = {series.device: series for series in device_telemetry.node_telemetry(ctx, node)}
    assert list(by_device) == ["cpu", "0", "1"]
    host = by_device["cpu"]
    assert host.memory_gib[0] is not None and host.memory_gib[0] > 0  # from /proc/meminfo
    assert any(u is not None and 0 <= u <= 1 for u in host.utilization)  # /proc/stat, from the 2nd sample
    assert by_device["1"].throttle[0] == "thermal (hardware)" and by_device["1"].temperature_c[0] == 88.0

    job_id = jobs.submit(ctx, validate_job_spec(spec_dict())).id
    with ctx.db.transaction() as session:
        session.add(
            Attempt(
                job_id=job_id, number=1, state="running", accelerator_type="h100-sxm", device_ids=[1],
                threads_per_process=1, node=node, log_path="/dev/null", started_at=started,
            )
        )  # fmt: skip
    (held,) = device_telemetry.job_telemetry(ctx, job_id)
    assert (held.device, held.attempt, held.utilization[0]) == ("1", 1, pytest.approx(0.55))


def test_rocm_and_gaudi_tools_are_read_where_present() -> None:
    rocm = parse_rocm_smi(
        '{"card0": {"GPU use (%)": "93", "VRAM Total Used Memory (B)": "68719476736",'
        ' "Average Graphics Package Power (W)": "512.0", "Temperature (Sensor edge) (C)": "64.0"}}'
    )
    assert rocm == [DeviceReading("0", utilization=0.93, memory_gib=64.0, power_w=512.0, temperature_c=64.0)]
    gaudi = parse_hl_smi("0, 88, 65536, 450, 55\n1, N/A, 0, 100, 30\n")
    assert gaudi[0] == DeviceReading(
        "0", utilization=0.88, memory_gib=64.0, power_w=450.0, temperature_c=55.0
    )
    assert gaudi[1].utilization is None
    assert parse_rocm_smi("not json") == [] and throttle_words(0x1) is None  # idle is not throttling


def test_samples_older_than_a_day_are_kept_as_one_average_a_minute(ctx: ServiceContext) -> None:
    now = time.time()
    minute = (now - 25 * 3600) // 60 * 60  # a whole minute, a day and an hour ago
    with ctx.db.transaction() as session:
        session.execute(
            insert(DeviceSample),
            [{"node": "n1", "device": "0", "at": minute + 5 * i, "utilization": i / 11, "power_w": 100.0 + i}
             for i in range(12)]
            + [{"node": "n1", "device": "0", "at": now - 60, "utilization": 1.0}],  # recent: kept as it is
        )  # fmt: skip
        assert telemetry.compact_samples(session, now) == 1
    with ctx.db.read() as session:
        kept = session.execute(select(DeviceSample.at, DeviceSample.utilization, DeviceSample.power_w)).all()
    assert sorted(kept) == [(minute + 27.5, pytest.approx(0.5), pytest.approx(105.5)), (now - 60, 1.0, None)]
