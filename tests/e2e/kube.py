"""Small kubectl-based helpers for e2e tests (the same kubectl the cluster was built with)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from localcluster.cluster import LocalCluster
from tests.e2e.apireader import ApiReader

T = TypeVar("T")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_docs(name: str) -> list[dict[str, Any]]:
    """The documents of one shipped example, as a user would apply them."""
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def hub_secret_refs(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(Secret, key) pairs the models' weights sources name: the examples tell users to create these first."""
    refs = set()
    for doc in docs:
        ref = ((doc.get("spec") or {}).get("model") or {}).get("source", {}).get("hubSecretRef")
        if ref:
            refs.add((ref["name"], ref["key"]))
    return refs


_readers: dict[Path, ApiReader] = {}


def reader(cluster: LocalCluster) -> ApiReader:
    """One in-process reader per cluster (its connections are per thread)."""
    path = cluster.paths.kubeconfig
    if path not in _readers:
        _readers[path] = ApiReader(path)
    return _readers[path]


class Kube:
    def __init__(self, cluster: LocalCluster, namespace: str | None = None) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def run(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        ns = ["-n", self.namespace] if self.namespace else []
        return self.cluster.kubectl(*ns, *args, input_text=input_text, check=check)

    def get(self, kind: str, name: str | None = None, selector: str | None = None) -> Any:
        """The object (or list) as JSON; None when a named object does not exist (yet). Read in-process
        (tests/e2e/apireader.py: a kubectl process per poll cost the lanes a large share of the CPU); a
        kind kubectl alone can parse (`deployments.apps`, `a,b`) still goes through kubectl."""
        if not any(mark in kind for mark in "./,"):
            return reader(self.cluster).get(kind, name, self.namespace, selector)
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
            args.append("--ignore-not-found")
        if selector:
            args += ["-l", selector]
        text = self.run(*args)
        return json.loads(text) if text.strip() else None

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        return list(self.get(kind, selector=selector)["items"])

    def apply(self, obj: dict[str, Any] | list[dict[str, Any]] | str) -> str:
        text = obj if isinstance(obj, str) else yaml.safe_dump_all(obj if isinstance(obj, list) else [obj])
        return self.run("apply", "-f", "-", input_text=text)

    def apply_with_secrets(self, docs: list[dict[str, Any]]) -> str:
        """Apply models the way their examples say: the Hugging Face token Secret they name exists first (a
        kubelet-like fleet driver refuses to start a container whose Secret is missing, as a kubelet would)."""
        for name, key in sorted(hub_secret_refs(docs)):
            if self.get("secret", name) is None:
                self.run("create", "secret", "generic", name, f"--from-literal={key}=hf_e2e-placeholder")
        return self.apply(docs)

    def try_apply(self, text: str) -> tuple[bool, str]:
        """Apply and return (accepted, kubectl stderr) without raising."""
        import subprocess

        kubectl = self.cluster.binaries["kubectl"]
        ns = ["-n", self.namespace] if self.namespace else []
        result = subprocess.run([str(kubectl), "--kubeconfig", str(self.cluster.paths.kubeconfig), *ns,
                                 "apply", "-f", "-"], input=text, capture_output=True, text=True, check=False)
        return result.returncode == 0, result.stderr

    def events(self, involved: str | None = None) -> list[dict[str, Any]]:
        events = self.items("events")
        return [e for e in events if involved is None or e["involvedObject"]["name"] == involved]

    def events_once(self, involved: str, *reasons: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The object's events, once one of each reason has arrived. The operator posts events after the status
        write that carries the same news (kopf queues them), so a test that saw the status waits for them."""
        def arrived() -> list[dict[str, Any]] | None:
            events = self.events(involved)
            return events if set(reasons) <= {e["reason"] for e in events} else None

        def described() -> dict[str, Any]:
            # The operator's own events first (the Endpoints controller's repeat warnings would crowd them out).
            events = self.events(involved)
            ours = [f"{e['reason']}: {e['message'][:160]}" for e in events
                    if e.get("reportingComponent") != "endpoint-controller" and not e["reason"].startswith("Failed")]
            return {"missing": sorted(set(reasons) - {e["reason"] for e in events}), "operator events": ours[-12:],
                    "reasons seen": sorted({e["reason"] for e in events})}

        return wait_for(f"{', '.join(reasons)} events for {involved}", arrived, timeout_s, 0.5, describe=described)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 60.0,
    interval_s: float = 0.5,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll until probe returns something truthy; fail naming what we waited for, the last value and,
    with `describe`, the state that explains it."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    context = f"; state: {describe()!r}" if describe is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r}){context}")
