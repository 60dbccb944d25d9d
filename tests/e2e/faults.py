"""Fault injection for the K-change tests: refusals by admission policy, and a tuned model to change K on.

A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) refuses chosen writes of one object, the way a
webhook outage or a policy engine would; the test installs it, proves it refuses (a server-side dry run,
which runs admission without storing anything) and removes it again, proving that too.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.e2e.kube import Kube, wait_for

INITIAL_K = 5
# Applying or deleting a policy reaches the API server's admission within about a second; allow for load.
POLICY_SYNC_S = 30


class AdmissionFault:
    """One ValidatingAdmissionPolicy and its binding, refusing UPDATEs of one named object."""

    def __init__(self, kube: Kube, name: str, group: str, resource: str, object_name: str, expression: str,
                 message: str, probe: Callable[[], list[str]]) -> None:
        """`probe` gives the kubectl arguments of a write the policy must refuse (run as a dry run)."""
        self.kube = kube
        self.name = name
        self.message = message
        self.probe = probe
        assert kube.namespace is not None
        rule = {"apiGroups": [group], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [resource],
                "resourceNames": [object_name]}
        self.objects: list[dict[str, Any]] = [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"failurePolicy": "Fail",
                      "matchConstraints": {
                          "resourceRules": [rule],
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.namespace}}},
                      "validations": [{"expression": expression, "message": message}]}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name},
             "spec": {"policyName": name, "validationActions": ["Deny"]}},
        ]

    @classmethod
    def refuse_status_writes(cls, kube: Kube, model: str) -> AdmissionFault:
        """Every write of the model's status subresource is refused."""
        return cls(kube, f"e2e-refuse-status-{kube.namespace}", "specdec.io", "speculativemodels/status", model,
                   "false", f"e2e fault: status writes of {model} are refused",
                   lambda: ["patch", "speculativemodel", model, "--subresource=status", "--type=merge",
                            "-p", json.dumps({"status": {"summary": {"canary": "e2e-probe"}}})])

    @classmethod
    def refuse_k_decisions(cls, kube: Kube, model: str) -> AdmissionFault:
        """Status writes that change a pool's recorded K are refused; every other status write passes, so the
        policy can be in force before the model exists and its first decision cannot slip past it."""
        unchanged = ("!has(oldObject.status) || !has(oldObject.status.pools) || !has(object.status) || "
                     "!has(object.status.pools) || object.status.pools.all(p, "
                     "!oldObject.status.pools.exists(o, o.name == p.name) || "
                     "oldObject.status.pools.exists(o, o.name == p.name && o.effectiveK == p.effectiveK))")

        def probe() -> list[str]:
            pools = kube.get("sm", model)["status"]["pools"]
            moved = [{**pool, "effectiveK": int(pool["effectiveK"]) % 8 + 1} for pool in pools]
            return ["patch", "speculativemodel", model, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"pools": moved}})]

        return cls(kube, f"e2e-refuse-decision-{kube.namespace}", "specdec.io", "speculativemodels/status", model,
                   unchanged, f"e2e fault: K decisions of {model} cannot be recorded", probe)

    @classmethod
    def refuse_rollouts(cls, kube: Kube, deployment: str) -> AdmissionFault:
        """Writes that would change the Deployment's pod template (a rollout) are refused; others pass."""
        return cls(kube, f"e2e-refuse-rollout-{kube.namespace}", "apps", "deployments", deployment,
                   "object.spec.template == oldObject.spec.template",
                   f"e2e fault: pod template changes of {deployment} are refused",
                   lambda: ["patch", "deployment", deployment, "--type=merge", "-p", json.dumps(
                       {"spec": {"template": {"metadata": {"annotations": {"specdec.io/e2e-probe": "1"}}}}})])

    def refuses(self) -> bool:
        """Whether the API server refuses the probe write now (a dry run: admission runs, nothing is stored)."""
        kubectl = self.kube.cluster.binaries["kubectl"]
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kube.cluster.paths.kubeconfig), "-n", str(self.kube.namespace),
             *self.probe(), "--dry-run=server"], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return False
        if self.message in result.stderr:
            return True
        raise AssertionError(f"probe write failed for another reason: {result.stderr.strip()}")

    def install(self, verify: bool = True) -> None:
        """Apply the policy; with `verify`, wait until the API server refuses the probe write (the object must
        exist then; installed before the object exists, call `verify` once it does)."""
        self.kube.apply(self.objects)
        if verify:
            self.verify()

    def verify(self) -> None:
        wait_for(f"policy {self.name} refusing writes", self.refuses, POLICY_SYNC_S, 0.5)

    def remove(self) -> None:
        self.remove_now()
        wait_for(f"policy {self.name} gone", lambda: not self.refuses(), POLICY_SYNC_S, 0.5)

    def remove_now(self) -> None:
        """Delete the policy without waiting for the API server to notice."""
        for obj in reversed(self.objects):
            self.kube.cluster.kubectl("delete", obj["kind"], self.name, "--ignore-not-found", "--wait=false")

    @contextmanager
    def installed(self, verify: bool = True) -> Iterator[AdmissionFault]:
        """Installed for the block; always removed at the end, even when the test fails inside."""
        self.install(verify)
        try:
            yield self
        finally:
            self.remove_now()


def tuned_model(name: str, profile: str = "e2e-opt-k2", interval_s: int = 10) -> dict[str, Any]:
    """A model whose tuner moves K away from INITIAL_K once, then holds for the rest of the test: the
    profile's best K is 2, and the cooldown outlasts any test."""
    return {
        "apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeModel", "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "drafters": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
            "speculation": {
                "initialK": INITIAL_K, "minK": 1, "maxK": 8,
                "autotune": {"intervalSeconds": interval_s, "minSamples": 2000, "minGain": 0.03,
                             "cooldownSeconds": 3600},
            },
            "placement": {"gfxTargets": ["gfx942"], "replicasPerPool": 2},
            "runtime": {"simulatorProfile": profile},
        },
    }


def decided_k(status: dict[str, Any], pool: str) -> int | None:
    """The K recorded in status for a pool: the one source of truth a renderer reads."""
    for entry in status.get("pools") or []:
        if entry.get("name") == pool:
            value = entry.get("effectiveK")
            return int(value) if value is not None else None
    return None


def running_k(kube: Kube, deployment: str) -> int | None:
    body = kube.get("deployment", deployment)
    if body is None:
        return None
    value = body["spec"]["template"]["metadata"].get("annotations", {}).get("specdec.io/num-speculative-tokens")
    return int(value) if value is not None else None


def template(kube: Kube, deployment: str) -> dict[str, Any]:
    return dict(kube.get("deployment", deployment)["spec"]["template"])


def settle(kube: Kube, model: str, timeout_s: float = 120) -> str:
    """Wait until the model is Ready with one pool running INITIAL_K; returns the pool (Deployment) name."""
    def ready() -> str | None:
        status = kube.get("sm", model).get("status", {})
        conditions = status.get("conditions", [])
        pools = status.get("pools") or []
        if len(pools) != 1 or not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return None
        pool = str(pools[0]["name"])
        return pool if decided_k(status, pool) == INITIAL_K and running_k(kube, pool) == INITIAL_K else None

    return wait_for(f"{model} Ready at K={INITIAL_K}", ready, timeout_s, 1,
                    describe=lambda: kube.get("sm", model).get("status"))
