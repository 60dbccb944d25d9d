"""Counting write requests in the API server's audit log (the cluster logs writes only)."""

from __future__ import annotations

import json
from pathlib import Path

OPERATOR_AGENTS = ("specdec-operator", "kopf/")


def operator_writes_since(audit_log: Path, since_iso: str) -> list[str]:
    """Writes by the operator (our client or kopf's) received at or after `since_iso`."""
    writes = []
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("stage") != "ResponseComplete" or entry.get("requestReceivedTimestamp", "") < since_iso:
            continue
        if str(entry.get("userAgent", "")).startswith(OPERATOR_AGENTS):
            ref = entry.get("objectRef", {})
            writes.append(f"{entry['verb']} {ref.get('resource')}/{ref.get('name')} ({entry['userAgent']})")
    return writes


def operator_write_entries(audit_log: Path, since_iso: str) -> list[dict[str, str]]:
    """The operator's writes at or after `since_iso`, each with its time, verb, resource, subresource and name."""
    entries = []
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("stage") != "ResponseComplete" or entry.get("requestReceivedTimestamp", "") < since_iso:
            continue
        if str(entry.get("userAgent", "")).startswith(OPERATOR_AGENTS):
            ref = entry.get("objectRef", {})
            entries.append({
                "at": entry["requestReceivedTimestamp"], "verb": entry["verb"], "code": str(
                    entry.get("responseStatus", {}).get("code", "")),
                "resource": ref.get("resource", ""), "subresource": ref.get("subresource", ""),
                "name": ref.get("name", ""), "agent": entry.get("userAgent", ""),
            })
    return entries
