"""KubeApi over real HTTP on loopback: timeouts, retries on 429/5xx honouring Retry-After, no retry on refusals,
error bodies that are not JSON, and the resourceVersion precondition of status writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from specdec_operator.kube.api import KubeApi, KubeApiError
from specdec_operator.kube.retry import Backoff

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.answers: list[Handler] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        text = await request.text()
        body = json.loads(text) if text else None
        self.requests.append((request.method, request.path_qs, dict(request.headers), body))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return await answer(request)


def reply(status: int, body: str = "", headers: dict[str, str] | None = None, delay_s: float = 0.0) -> Handler:
    async def answer(_: web.Request) -> web.StreamResponse:
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(status=status, text=body, headers=headers, content_type="application/json")
    return answer


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, str]]:
    state = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield state, f"http://127.0.0.1:{test_server.port}"
    finally:
        await test_server.close()


def api_for(host: str, sleeps: list[float], timeout_s: float = 2.0, attempts: int = 3) -> KubeApi:
    configuration = client.Configuration(host=host)
    async def record(seconds: float) -> None:
        sleeps.append(seconds)
    return KubeApi(client.ApiClient(configuration), "specdec-operator", timeout_s=timeout_s,
                   backoff=Backoff(base_s=0.01, cap_s=0.5, attempts=attempts), sleep=record)


OK_MODEL = json.dumps({"metadata": {"name": "m", "resourceVersion": "8"}, "status": {"a": 1}})


async def test_throttling_is_retried_after_what_the_server_asked(server: tuple[Server, str]) -> None:
    state, host = server
    state.answers = [reply(429, '{"reason":"TooManyRequests","message":"slow down"}', {"Retry-After": "0.3"}),
                     reply(503, "<html>etcd leader changed</html>", {"Retry-After": "0.2"}),
                     reply(200, OK_MODEL)]
    sleeps: list[float] = []
    api = api_for(host, sleeps)
    try:
        stored = await api.patch_status("SpeculativeModel", "ns", "m", {"a": 1, "gone": None}, "7")
    finally:
        await api.close()
    assert stored["metadata"]["resourceVersion"] == "8"
    assert sleeps == [0.3, 0.2]
    method, path, headers, body = state.requests[-1]
    assert (method, path) == ("PATCH", "/apis/specdec.io/v1alpha1/namespaces/ns/speculativemodels/m/status")
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert body == {"status": {"a": 1, "gone": None}, "metadata": {"resourceVersion": "7"}}
    assert len(state.requests) == 3


async def test_server_errors_give_up_after_the_attempts_with_the_status_and_body(server: tuple[Server, str]) -> None:
    state, host = server
    state.answers = [reply(502, "<html><body>Bad Gateway</body></html>")]
    sleeps: list[float] = []
    api = api_for(host, sleeps, attempts=3)
    try:
        with pytest.raises(KubeApiError) as raised:
            await api.get("Deployment", "ns", "d")
    finally:
        await api.close()
    assert raised.value.status == 502 and "Bad Gateway" in raised.value.message
    assert len(state.requests) == 4 and len(sleeps) == 3
    assert all(0.0 <= s <= ceiling for s, ceiling in zip(sleeps, (0.01, 0.02, 0.04), strict=True))


async def test_a_refusal_is_not_retried_and_keeps_the_servers_message(server: tuple[Server, str]) -> None:
    state, host = server
    message = 'Deployment.apps "p" is invalid: spec.template.spec.containers[0].resources.limits[memory]: bad'
    state.answers = [reply(422, json.dumps({"kind": "Status", "reason": "Invalid", "message": message}))]
    sleeps: list[float] = []
    api = api_for(host, sleeps)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": "ns", "name": "p"}}
    try:
        with pytest.raises(KubeApiError) as raised:
            await api.apply(deployment)
    finally:
        await api.close()
    assert (raised.value.status, raised.value.reason, raised.value.message) == (422, "Invalid", message)
    assert raised.value.refused and len(state.requests) == 1 and sleeps == []


async def test_a_stuck_connection_times_out_and_is_retried(server: tuple[Server, str]) -> None:
    state, host = server
    state.answers = [reply(200, OK_MODEL, delay_s=2.0)]
    sleeps: list[float] = []
    api = api_for(host, sleeps, timeout_s=0.2, attempts=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(KubeApiError) as raised:
            await api.get("SpeculativeModel", "ns", "m")
    finally:
        await api.close()
    assert raised.value.status == 0 and not raised.value.refused
    assert len(state.requests) == 2 and len(sleeps) == 1
    assert loop.time() - started < 1.5  # two timed-out tries, not one 2 s hang


async def test_a_list_keeps_the_lists_resource_version_and_names_its_items(server: tuple[Server, str]) -> None:
    state, host = server
    state.answers = [reply(200, json.dumps({"kind": "DeploymentList", "apiVersion": "apps/v1",
                                            "metadata": {"resourceVersion": "912"},
                                            "items": [{"metadata": {"name": "d", "resourceVersion": "880"}}]}))]
    api = api_for(host, [])
    try:
        items, version = await api.list_versioned("Deployment", "ns", "a=b")
    finally:
        await api.close()
    assert version == "912"
    assert items == [{"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "d", "resourceVersion": "880"}}]
    assert state.requests[-1][:2] == ("GET", "/apis/apps/v1/namespaces/ns/deployments?labelSelector=a%3Db")
