"""Open-loop load through the gateway stand-in reaches simulators on loopback IPs by the route's weights."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from specdec_runtime.gateway_standin import GatewayStandIn, upstream_session
from specdec_runtime.loadgen import Lengths, LoadShape, run_load
from specdec_runtime.routing import ClusterView, Router
from specdec_runtime.simulator.server import Simulator, build_app
from specdec_runtime.simulator.vllm_cli import parse_serve_args
from tests.unit.runtime.simfactories import make_profile
from tests.unit.runtime.test_routing import GATEWAY, http_route, pod, service

SPEC = '{"method":"eagle","model":"org/drafter","num_speculative_tokens":3}'
IPS = {"s1": "127.0.77.1", "s2": "127.0.77.2", "c1": "127.0.77.3"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[str, dict[str, Simulator], Router]]:
    port = free_port()
    simulators: dict[str, Simulator] = {}
    runners: list[web.AppRunner] = []
    for name, ip in IPS.items():
        options = parse_serve_args(["serve", "org/target", "--served-model-name", "target", "--speculative-config",
                                    SPEC, "--profile", "unused.yaml", "--seed", "1", "--host", ip,
                                    "--port", str(port)])
        simulators[name] = Simulator(options, make_profile(concurrency=0, restart_s=0,
                                                           step_time={"base_s": 0.002, "per_token_s": 0.0}))
        runner = web.AppRunner(build_app(simulators[name], background_tick=False))
        await runner.setup()
        await web.TCPSite(runner, ip, port).start()
        runners.append(runner)
    pods = [pod(name, ip, {"track": "canary" if name.startswith("c") else "stable"}) for name, ip in IPS.items()]
    for item in pods:
        item["spec"] = {"containers": [{"ports": [{"name": "http", "containerPort": port}]}]}
    services = [service("m-stable", {"track": "stable"}), service("m-canary", {"track": "canary"})]
    for item in services:
        item["spec"]["ports"] = [{"port": 8000, "targetPort": "http"}]
    router = Router("gw")
    refs = [{"name": "m-stable", "port": 8000, "weight": 80}, {"name": "m-canary", "port": 8000, "weight": 20}]
    router.update(ClusterView(services=services, pods=pods, routes=[http_route(refs)], gateways=[GATEWAY]))
    gateway_port = free_port()
    async with upstream_session() as session:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", GatewayStandIn(router, session).handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", gateway_port).start()
        runners.append(runner)
        yield f"http://127.0.0.1:{gateway_port}", simulators, router
    for runner in runners:
        await runner.cleanup()


def completions(simulator: Simulator) -> float:
    text = simulator.replica.metrics_text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:request_success_total")


async def test_route_weights_and_service_spread_reach_the_simulators(
    fleet: tuple[str, dict[str, Simulator], Router]
) -> None:
    url, simulators, _ = fleet
    shape: Any = LoadShape(rate=400.0, prompt=Lengths(8), output=Lengths(4, 0.0), seed=2, stream=True)
    report = await run_load(url, "target", shape, host="model.example.test", max_requests=200)
    assert report.statuses == {200: 200}
    served = {name: completions(sim) for name, sim in simulators.items()}
    # 80/20 by the route (smooth weighted round robin: exact over 200), then even over the stable pods.
    assert served == {"s1": 80, "s2": 80, "c1": 40}
    by_service = await run_load(url, "target", shape, host="m-canary.ns.svc.cluster.local", max_requests=30)
    assert by_service.statuses == {200: 30}
    assert completions(simulators["c1"]) == 70
