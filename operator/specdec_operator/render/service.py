"""The Service in front of every pool of a model, and the per-track Services an HTTPRoute can weight."""

from __future__ import annotations

from typing import Any

from specdec_operator.render.names import label_value, model_labels, owner_reference, service_name
from specdec_runtime import contract

SERVICE_PORT = 8000


def service_url(namespace: str, model: str) -> str:
    """The model's Service as clients in the cluster reach it (status.url)."""
    return f"http://{service_name(model)}.{namespace}.svc:{SERVICE_PORT}"


def service(namespace: str, model: str, uid: str, track: str | None = None) -> dict[str, Any]:
    """track None: all pools and tracks (replica-ratio split); "stable"/"canary": HTTPRoute backends."""
    selector = {contract.LABEL_MODEL: label_value(model)}
    name = service_name(model, track)
    if track is not None:
        selector[contract.LABEL_TRACK] = track
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": model_labels(model),
            "ownerReferences": [owner_reference(model, uid)],
        },
        "spec": {
            "selector": selector,
            "ports": [{"name": contract.PORT_NAME, "port": SERVICE_PORT, "targetPort": contract.PORT_NAME,
                       "protocol": "TCP"}],
        },
    }
