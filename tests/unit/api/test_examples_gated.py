"""Examples a newcomer applies first: gated Hugging Face models come with their token Secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdec_operator.crdfiles import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
# Organisations whose checkpoints need an accepted licence and a token (a 401 without one).
GATED = ("meta-llama/", "mistralai/", "google/gemma")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_gated_models_name_a_hub_secret(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] != "SpeculativeModel":
            continue
        spec = doc["spec"]
        checkpoints = [spec["model"]["name"], *(d.get("model", "") for d in spec.get("drafters", []))]
        if any(name.startswith(GATED) for name in checkpoints):
            assert spec["model"].get("source", {}).get("hubSecretRef", {}).get("name"), doc["metadata"]["name"]
