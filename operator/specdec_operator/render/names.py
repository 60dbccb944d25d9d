"""Names and labels of owned objects."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from specdec_operator import API_VERSION, KIND
from specdec_runtime import contract


def pool_name(model: str, gfx: str) -> str:
    return f"{model}-{gfx}"


def deployment_name(pool: str, track: str) -> str:
    return pool if track == "stable" else f"{pool}-canary"


def content_hash(value: Any, length: int = 10) -> str:
    """Stable short hash of JSON-able content: same content, same name, across restarts and replicas."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def model_labels(model: str) -> dict[str, str]:
    return {
        contract.LABEL_NAME: contract.RUNTIME_NAME,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
        contract.LABEL_INSTANCE: model,
        contract.LABEL_MODEL: model,
    }


def pool_labels(model: str, pool: str, gfx: str) -> dict[str, str]:
    return {**model_labels(model), contract.LABEL_POOL: pool, contract.LABEL_GFX: gfx}


def owner_reference(model: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": model,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
