"""Where the generated CRD lives: crds/ and the chart's crds/ hold byte-identical copies."""

from __future__ import annotations

from pathlib import Path

from specdec_operator.api.crdgen import render_crd_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE_NAME = "specdec.io_speculativemodels.yaml"
CRD_PATHS = (
    REPO_ROOT / "crds" / CRD_FILE_NAME,
    REPO_ROOT / "charts" / "specdec-operator" / "crds" / CRD_FILE_NAME,
)


def write_crd_files() -> list[Path]:
    text = render_crd_yaml()
    for path in CRD_PATHS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(CRD_PATHS)


def check_crd_files() -> list[Path]:
    """Paths whose content differs from what the models generate (missing counts as different)."""
    text = render_crd_yaml()
    return [path for path in CRD_PATHS if not path.exists() or path.read_text() != text]
