"""checkov 3.3 (kubernetes framework) on the chart's manifests and on the runtime Deployments the operator renders.

Every finding is either fixed or skipped in place with a one-line reason: `checkov.io/skip<N>` annotations in the
chart's templates, and tests/unit/shipping/checkov-runtime-skips.yaml for the runtime Deployments (the operator
keeps scanner annotations off the objects it owns). A new finding without a reason fails the test, and so does a
skip that nothing needs any more.

checkov lives in a venv of its own (hack/checkov-env, which hack/test runs before the suite); these tests are
skipped only when that venv cannot be created.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.decisions.drafter import FALLBACK
from specdec_operator.decisions.runtime_env import plan_runtime
from specdec_operator.render import pool as render
from specdec_operator.render.names import pool_name
from specdec_operator.render.podspec import PodSettings
from specdec_operator.settings import DEFAULT_IMAGE_TARGETS, DEFAULT_IMAGES
from tests.unit.shipping.chart import REPO_ROOT, Manifest, load_values
from tests.unit.shipping.chart import render as render_chart

RUNTIME_SKIPS = Path(__file__).with_name("checkov-runtime-skips.yaml")
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
# Every optional object the chart can render, so each one is scanned.
EVERYTHING_ON = (
    "networkPolicy.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.podMonitor.enabled=true",
    "crds.templated=true",
)


@dataclass(frozen=True)
class Finding:
    check_id: str
    name: str
    resource: str
    file: str

    def __str__(self) -> str:
        return f"{self.check_id} {self.name} on {self.resource} ({self.file})"


@pytest.fixture(scope="session")
def checkov() -> str:
    """The checkov executable of hack/checkov-env: created on first use, cached in the user's cache after."""
    try:
        made = subprocess.run([str(REPO_ROOT / "hack" / "checkov-env")], capture_output=True, text=True,
                              timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"hack/checkov-env could not create checkov's venv: {error}")
    if made.returncode != 0:
        tail = "\n".join(made.stderr.strip().splitlines()[-5:])
        pytest.skip(f"hack/checkov-env could not create checkov's venv (exit {made.returncode}): {tail}")
    return made.stdout.strip().splitlines()[-1]


def scan(checkov: str, directory: Path) -> tuple[list[Finding], int]:
    """(failed checks, passed count) of checkov's kubernetes checks over every manifest in `directory`."""
    # Offline: no update check, no policy download from the platform, and any other request meets a closed
    # loopback port (tests connect only to 127.0.0.0/8).
    env = {**os.environ, "LOG_LEVEL": "WARNING", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "BC_SKIP_MAPPING": "TRUE",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    result = subprocess.run(
        [checkov, "--directory", str(directory), "--framework", "kubernetes", "--output", "json",
         "--skip-download", "--quiet", "--compact"],
        capture_output=True, text=True, timeout=600, check=False, env=env, cwd=directory,
    )
    # 0: nothing failed, 1: something failed; anything else is checkov itself breaking.
    assert result.returncode in (0, 1), f"checkov exited {result.returncode}:\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    (kubernetes,) = [r for r in reports if r.get("check_type") == "kubernetes"]
    results = kubernetes["results"]

    failed = [Finding(c["check_id"], c["check_name"], c["resource"], c["file_path"])
              for c in results.get("failed_checks", [])]
    # --quiet leaves passed and skipped checks out of the results; the summary still counts them.
    return failed, int(kubernetes["summary"]["passed"])


def write_manifests(directory: Path, manifests: list[Manifest]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, manifest in enumerate(manifests):
        name = f"{index:03d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
        (directory / name).write_text(yaml.safe_dump(manifest, sort_keys=False))


# --- the chart ------------------------------------------------------------------------------------------------


def without_checkov_skips(manifests: list[Manifest]) -> list[Manifest]:
    stripped = copy.deepcopy(manifests)
    for manifest in stripped:
        annotations = manifest["metadata"].get("annotations") or {}
        for key in [key for key in annotations if key.startswith("checkov.io/skip")]:
            del annotations[key]
    return stripped


def chart_skips(manifests: list[Manifest]) -> list[tuple[str, str, str]]:
    """(kind, check id, reason) of every `checkov.io/skip<N>: <check id>=<reason>` annotation."""
    return [(doc["kind"], *value.partition("=")[::2]) for doc in manifests
            for key, value in (doc["metadata"].get("annotations") or {}).items() if key.startswith("checkov.io/skip")]


@dataclass(frozen=True)
class ChartScan:
    failed: list[Finding]  # with the chart's skips
    failed_without_skips: list[Finding]
    skips: list[tuple[str, str, str]]


@pytest.fixture(scope="module")
def chart_scan(checkov: str, helm: str, tmp_path_factory: pytest.TempPathFactory) -> ChartScan:
    """One checkov run over the chart rendered with defaults and with every optional object on, each as rendered
    and with its skip annotations removed (which shows what the skips still hold back)."""
    directory = tmp_path_factory.mktemp("checkov-chart")
    renders = {"default": render_chart(helm), "everything-on": render_chart(helm, *EVERYTHING_ON)}
    for name, manifests in renders.items():
        write_manifests(directory / "as-rendered" / name, manifests)
        write_manifests(directory / "without-skips" / name, without_checkov_skips(manifests))
    failed, passed = scan(checkov, directory)
    assert passed > 0, "checkov found nothing to check in the rendered chart"
    return ChartScan(
        failed=[f for f in failed if f.file.startswith("/as-rendered/")],
        failed_without_skips=[f for f in failed if f.file.startswith("/without-skips/")],
        skips=chart_skips(renders["everything-on"]) + chart_skips(renders["default"]),
    )


def test_checkov_finds_nothing_unjustified_in_the_chart(chart_scan: ChartScan) -> None:
    assert chart_scan.failed == [], (
        "new checkov findings on the chart: fix them, or skip each in place with a reason:\n"
        + "\n".join(map(str, chart_scan.failed)))


def test_every_chart_skip_is_still_needed_and_says_why(chart_scan: ChartScan) -> None:
    """The `checkov.io/skip<N>` annotations say `<check id>=<one-line reason>`, and each holds back a finding."""
    assert chart_scan.skips, "the chart skips nothing; drop this test's premise if that is now true"
    held_back = {(f.resource.split(".", 1)[0], f.check_id) for f in chart_scan.failed_without_skips}
    for kind, check_id, reason in chart_scan.skips:
        assert check_id.startswith("CKV") and len(reason.split()) >= 4 and "\n" not in reason, (kind, check_id)
        assert (kind, check_id) in held_back, f"{kind} skips {check_id}, which no longer fails: remove the skip"


# --- the runtime Deployments ----------------------------------------------------------------------------------


def chart_pod_settings() -> PodSettings:
    """The runtime pod settings the chart installs by default."""
    pod = load_values()["runtime"]["pod"]
    return PodSettings(security=pod["security"], supplemental_groups=tuple(pod["supplementalGroups"]),
                       fs_group=pod["fsGroup"], weights_cache_claim=pod["weightsCacheClaim"] or None)


def example_models() -> Iterator[tuple[str, SpeculativeModelSpec]]:
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "SpeculativeModel":
                yield doc["metadata"]["name"], SpeculativeModelSpec.model_validate(doc["spec"])


def runtime_deployments() -> list[Manifest]:
    """One Deployment per pool of every example, rendered by the operator's pure renderers with the chart's
    default pod settings: each gfx target's image and environment, the first drafter (or the ngram fallback)."""
    deployments: list[Manifest] = []
    for name, spec in example_models():
        for gfx in spec.placement.gfx_targets:
            image = spec.runtime.image or DEFAULT_IMAGES[gfx]
            plain_env = {e.name: e.value for e in spec.runtime.env if e.value_from is None}
            runtime = plan_runtime(gfx, image, DEFAULT_IMAGE_TARGETS.get(image), plain_env, spec.model.attention)
            drafter = spec.drafters[0] if spec.drafters else FALLBACK
            ctx = render.PoolIdentity("inference", name, "00000000-0000-4000-8000-000000000000", pool_name(name, gfx),
                                     gfx)
            config = render.runtime_config(spec, drafter, spec.speculation.initial_k)
            config_map = render.config_map(ctx, config)
            track = render.PoolTrack("stable", spec.speculation.initial_k, config_map["metadata"]["name"])
            template = render.pod_template(ctx, spec, runtime, track, pod_settings=chart_pod_settings())
            deployments.append(render.deployment(ctx, template, 2, "stable"))
    return deployments


def runtime_skips() -> dict[str, str]:
    skips: dict[str, str] = yaml.safe_load(RUNTIME_SKIPS.read_text())
    return skips


@pytest.fixture(scope="module")
def runtime_scan(checkov: str, tmp_path_factory: pytest.TempPathFactory) -> list[Finding]:
    directory = tmp_path_factory.mktemp("checkov-runtime")
    deployments = runtime_deployments()
    assert len(deployments) >= len(EXAMPLES), "every example renders at least one pool"
    write_manifests(directory, deployments)
    failed, passed = scan(checkov, directory)
    assert passed > 0, "checkov found nothing to check in the runtime Deployments"
    return failed


def test_checkov_finds_nothing_unjustified_in_the_runtime_deployments(runtime_scan: list[Finding]) -> None:
    skips = runtime_skips()
    unjustified = [finding for finding in runtime_scan if finding.check_id not in skips]
    assert unjustified == [], (
        "new checkov findings on the runtime Deployments: fix the renderer, or add the check id to "
        f"{RUNTIME_SKIPS.name} with a one-line reason:\n" + "\n".join(map(str, unjustified)))


def test_every_runtime_skip_is_still_needed_and_says_why(runtime_scan: list[Finding]) -> None:
    skips = runtime_skips()
    failing = {finding.check_id for finding in runtime_scan}
    assert sorted(set(skips) - failing) == [], f"skipped in {RUNTIME_SKIPS.name} but no longer found: remove them"
    for check_id, reason in skips.items():
        assert check_id.startswith("CKV") and isinstance(reason, str), check_id
        assert len(reason.split()) >= 4 and "\n" not in reason.strip(), f"{check_id}: give a one-line reason"


def test_the_runtime_deployments_carry_the_production_defaults() -> None:
    """What checkov checks on its own terms, stated as ours: requests, no token, bounded /dev/shm."""
    for deployment in runtime_deployments():
        pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), deployment["metadata"]["name"]
        assert container["resources"]["limits"]["memory"], deployment["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False
        assert all("sizeLimit" in volume["emptyDir"] for volume in pod["volumes"] if "emptyDir" in volume)
