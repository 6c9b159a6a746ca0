"""Prometheus series of the server: requests of this process by route, and the platform's state
read from the database at each scrape."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shipyard.agent import telemetry


class Metrics:
    """Prometheus series: requests of this server process, and the platform's state read from the
    database at each scrape (so every server of a cluster reports the same figures)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, text, labels, registry=self.registry)

        self.requests = Counter(
            "shipyard_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "shipyard_http_request_seconds", "HTTP request latency", ["route"], registry=self.registry
        )
        self.jobs = gauge("shipyard_jobs", "Jobs by state", ("state",))
        self.queue_wait = gauge("shipyard_queue_wait_seconds_max", "Longest wait of a queued job")
        self.wait_quantiles = gauge(
            "shipyard_queue_wait_seconds", "Submission to start, jobs started in the last hour", ("quantile",)
        )
        self.pass_s = gauge("shipyard_agent_pass_seconds", "Duration of the agent's last pass", ("node",))
        self.schedule_s = gauge(
            "shipyard_scheduling_seconds", "Scheduling decision and launches in the last pass", ("node",)
        )
        self.pass_age = gauge(
            "shipyard_agent_last_pass_age_seconds", "Since the agent's last pass", ("node",)
        )
        self.devices = gauge("shipyard_devices", "Devices (cpu: cores) per type", ("node", "type"))
        self.in_use = gauge(
            "shipyard_devices_in_use", "Devices (cpu: cores) leased to jobs", ("node", "type")
        )
        self.utilization = gauge(
            "shipyard_device_utilization_ratio", "Busy fraction the vendor reports", ("node", "device")
        )
        self.stragglers = gauge(
            "shipyard_straggler_ratio",
            "A straggling rank's compute per step over its attempt's median rank",
            ("job", "rank"),
        )

    def observe(self, state: telemetry.ClusterMetrics) -> None:
        for series in (self.wait_quantiles, self.pass_s, self.schedule_s, self.pass_age, self.devices,
                       self.in_use, self.utilization, self.stragglers):  # fmt: skip
            series.clear()  # a node or quantile that is gone must not linger with its last value
        for job_state, count in state.jobs_by_state.items():
            self.jobs.labels(job_state).set(count)
        self.queue_wait.set(state.oldest_queued_wait_s)
        for quantile, seconds in state.queue_wait_s.items():
            self.wait_quantiles.labels(str(quantile)).set(seconds)
        for agent in state.agents:
            node = agent["node"]
            self.pass_s.labels(node).set(agent["pass_s"])
            self.schedule_s.labels(node).set(agent["schedule_s"])
            self.pass_age.labels(node).set(agent["age_s"])
            for accelerator_type, counts in agent["devices"].items():
                self.devices.labels(node, accelerator_type).set(counts["total"])
                self.in_use.labels(node, accelerator_type).set(counts["in_use"])
            for device, busy in agent["utilization"].items():
                self.utilization.labels(node, device).set(busy)
        for job_id, rank, ratio in state.stragglers:
            self.stragglers.labels(job_id, str(rank)).set(ratio)


class MeasureRequests:
    """Counts and times every request by route template. A plain ASGI middleware: Starlette's
    ``BaseHTTPMiddleware`` runs each request through an extra task and memory stream."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], path, str(status[0])).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - start)
