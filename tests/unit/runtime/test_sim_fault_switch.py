"""A simulator can be told to start failing requests while it serves (POST /faults), so an e2e test can make a
canary fail exactly when its 100% step starts, waiting on status rather than on a timer."""

from __future__ import annotations

from specdec_runtime.simulator.server import INJECTED_ERROR
from tests.unit.runtime.test_sim_server import ClientFactory, FakeClock, make_client  # noqa: F401 - fixture

BODY = {"model": "target", "prompt": "hi", "max_tokens": 4}


async def test_post_faults_makes_a_serving_simulator_fail_requests_from_then_on(
    make_client: ClientFactory,  # noqa: F811
) -> None:
    client = await make_client(FakeClock(1000.0))
    assert (await client.post("/v1/completions", json=BODY)).status == 200
    switched = await client.post("/faults", json={"error_rate": 1.0})
    assert switched.status == 200 and (await switched.json()) == {"error_rate": 1.0}
    failed = await client.post("/v1/completions", json=BODY)
    assert failed.status == 500 and INJECTED_ERROR in (await failed.text())
    assert (await client.post("/faults", json={"error_rate": 0.0})).status == 200
    assert (await client.post("/v1/completions", json=BODY)).status == 200


async def test_post_faults_refuses_a_rate_outside_0_to_1(make_client: ClientFactory) -> None:  # noqa: F811
    client = await make_client(FakeClock(1000.0))
    for body in ({"error_rate": 1.5}, {"error_rate": "x"}, {}):
        response = await client.post("/faults", json=body)
        assert response.status == 400 and "error_rate" in await response.text()
