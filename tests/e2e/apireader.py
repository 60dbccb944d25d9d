"""Reads from the local API server over HTTPS in-process, for the e2e tests' polls.

Every `kubectl get` is a Go process: about 0.2 s of CPU to start, read the kubeconfig and decode. The e2e tests
poll twice a second in five lanes and the exclusive pass at once, so on two cores those processes alone took a
large share of the CPU the operator and the simulators under test needed. A GET here costs a few milliseconds.
It reads only; writes (apply, patch, delete) still go through kubectl, as a user would send them.

Names resolve as kubectl resolves them, from the API server's discovery: plural, singular, short names
(`sm`, `hpa`) and kinds, the core group first, each group at its preferred version. The answer has kubectl's
shape: a named object, or a `List` whose items carry apiVersion and kind.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.errors import ClusterError


@dataclass(frozen=True)
class Resource:
    prefix: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/apis/").removeprefix("/api/")


class ApiReader:
    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        server = urllib.parse.urlsplit(cluster["server"])
        if server.hostname is None or not server.hostname.startswith("127."):
            raise ClusterError(f"the e2e tests read only from loopback API servers, not {cluster['server']}")
        self._host, self._port = server.hostname, server.port or 443
        self._tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self._local = threading.local()
        self._resources: dict[str, Resource] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, name: str | None, namespace: str | None, selector: str | None) -> Any:
        """What `kubectl get KIND [NAME] -o json [--ignore-not-found] [-l SELECTOR]` prints, parsed; None for a
        named object that does not exist."""
        resource = self._resolve(kind)
        path = resource.prefix
        if resource.namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{resource.plural}"
        if name:
            status, body = self._request(f"{path}/{urllib.parse.quote(name)}")
            if status == 404:
                return None
            return self._checked(status, body, kind)
        query = f"?{urllib.parse.urlencode({'labelSelector': selector})}" if selector else ""
        listed = self._checked(*self._request(path + query), kind)
        items = [{"apiVersion": resource.api_version, "kind": resource.kind, **item} for item in listed["items"]]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}

    def _checked(self, status: int, body: bytes, kind: str) -> Any:
        if status != 200:
            message = body.decode(errors="replace")
            with contextlib.suppress(ValueError):
                message = json.loads(body).get("message", message)
            raise ClusterError(f"GET {kind} failed ({status}): {message}")
        return json.loads(body)

    def _request(self, path: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            connection = getattr(self._local, "connection", None)
            if connection is None:
                connection = self._local.connection = http.client.HTTPSConnection(
                    self._host, self._port, context=self._tls, timeout=30)
            try:
                connection.request("GET", path, headers={"Accept": "application/json"})
                response = connection.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._local.connection = None
                # A kept-alive connection the server closed meanwhile: one fresh try. A second failure is the
                # server's (down, restarting): say so as kubectl would fail.
                if attempt == 2:
                    raise ClusterError(f"GET {path} failed: {error}") from error
        raise AssertionError("unreachable")

    def _resolve(self, kind: str) -> Resource:
        key = kind.lower()
        with self._lock:
            if key not in self._resources:
                # Unknown: discover again (a CRD installed since the last discovery).
                self._resources = self._discover()
            if key not in self._resources:
                raise ClusterError(f'the server doesn\'t have a resource type "{kind}"')
            return self._resources[key]

    def _discover(self) -> dict[str, Resource]:
        prefixes = ["/api/v1"]
        groups = self._checked(*self._request("/apis"), "APIGroupList")["groups"]
        prefixes += [f"/apis/{group['preferredVersion']['groupVersion']}" for group in groups]
        names: dict[str, Resource] = {}
        for prefix in prefixes:
            status, body = self._request(prefix)
            if status != 200:
                continue  # an aggregated API that is not serving (as kubectl, skip it)
            for entry in json.loads(body)["resources"]:
                if "/" in entry["name"]:
                    continue  # subresources
                resource = Resource(prefix, entry["name"], entry["namespaced"], entry["kind"])
                for name in (entry["name"], entry.get("singularName") or "", entry["kind"].lower(),
                             *entry.get("shortNames", [])):
                    if name:
                        names.setdefault(name.lower(), resource)  # the first group wins: core first
        return names
