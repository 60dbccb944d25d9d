"""Names and labels of owned objects.

A SpeculativeModel's name may be a 253-character DNS subdomain, but label values and Service names
stop at 63 characters and Service names admit no dots. Names that do not fit are shortened to a
readable prefix plus a hash of the whole name: deterministic, and distinct for distinct models.

Distinct models never share a name, because a name left as it is can never take the shape of a
shortened one or of another model's name plus a suffix:
- a shortened name ends in `-<10 hex digits>`, so a model whose own name ends that way is always
  shortened too (else `m-<hash>` could be a long model's label, pool, Deployment or Service);
- track Services are `<model>-stable` and `<model>-canary`, so the main Service of a model whose
  name ends in `-stable` or `-canary` is shortened (else model `a-canary` would own model `a`'s
  canary Service name).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from specdec_operator import API_VERSION, KIND
from specdec_runtime import contract

MAX_LABEL_LENGTH = 63  # label values, and DNS-1035 labels such as Service names
_HASH_LENGTH = 10
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_HASH_SUFFIX = re.compile(rf"-[0-9a-f]{{{_HASH_LENGTH}}}\Z")  # what `_shortened` ends with
TRACKS = ("stable", "canary")  # a track's Service is `<model>-<track>`


def _kept(model: str, room: int) -> bool:
    """Whether the model's name may be used as it is: it fits and cannot be mistaken for a shortened name."""
    return len(model) <= room and _HASH_SUFFIX.search(model) is None


def _shortened(prefix: str, whole: str, room: int) -> str:
    """`prefix` cut to leave room for `-<hash of whole>`, ending on an alphanumeric character."""
    return f"{prefix[: room - _HASH_LENGTH - 1].rstrip('-.')}-{content_hash(whole, _HASH_LENGTH)}"


def label_value(model: str) -> str:
    """The model's name as a label value (selectors must use this, not the name)."""
    return model if _kept(model, MAX_LABEL_LENGTH) else _shortened(model, model, MAX_LABEL_LENGTH)


def pool_name(model: str, gfx: str) -> str:
    """`<model>-<gfx>`; also a label value, so at most 63 characters, keeping the gfx suffix readable."""
    room = MAX_LABEL_LENGTH - len(gfx) - 1
    return f"{model if _kept(model, room) else _shortened(model, model, room)}-{gfx}"


def service_name(model: str, track: str | None = None) -> str:
    """The model's Service (`<model>`) or a track's (`<model>-<track>`) as a valid DNS-1035 label."""
    suffix = "" if track is None else f"-{track}"
    looks_like_a_track = track is None and model.endswith(tuple(f"-{name}" for name in TRACKS))
    if _kept(model, MAX_LABEL_LENGTH - len(suffix)) and _DNS_1035_LABEL.fullmatch(model) and not looks_like_a_track:
        return f"{model}{suffix}"
    # Subdomain characters are lowercase alphanumerics, '-' and '.'; a label also starts with a letter.
    readable = re.sub(r"[^a-z0-9-]", "-", model).lstrip("-0123456789") or "sm"
    return f"{_shortened(readable, model, MAX_LABEL_LENGTH - len(suffix))}{suffix}"


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
        contract.LABEL_INSTANCE: label_value(model),
        contract.LABEL_MODEL: label_value(model),
    }


def model_selector(model: str) -> str:
    """The label selector (string form) of every runtime pod of the model: what the scale subresource reports."""
    return ",".join(f"{key}={value}" for key, value in sorted(
        {contract.LABEL_MANAGED_BY: contract.MANAGED_BY, contract.LABEL_MODEL: label_value(model)}.items()))


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
