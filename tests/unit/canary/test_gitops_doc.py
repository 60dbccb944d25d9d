"""docs/gitops.md must show the health check that the chart ships, and name the operator's annotation."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from specdec_operator.canary.progress import CANARY_ACTION_ANNOTATION, MANUAL_ACTIONS

ROOT = Path(__file__).parents[3]
DOC = (ROOT / "docs" / "gitops.md").read_text()
SCRIPT = (ROOT / "charts" / "specdec-operator" / "files" / "argocd-health.lua").read_text()


def test_argocd_cm_snippet_carries_the_shipped_script() -> None:
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)]
    configmaps = [block for block in blocks if isinstance(block, dict) and block.get("kind") == "ConfigMap"]
    assert len(configmaps) == 1
    assert configmaps[0]["metadata"]["name"] == "argocd-cm"
    assert configmaps[0]["data"] == {"resource.customizations.health.specdec.io_SpeculativeModel": SCRIPT}


def test_every_manual_action_is_documented() -> None:
    for action in MANUAL_ACTIONS:
        assert f"| `{action}` |" in DOC
    assert f"{CANARY_ACTION_ANNOTATION}=pause" in DOC
