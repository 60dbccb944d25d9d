"""`bench tuner` on a tiny profile: the table, the JSON and the errors (the full run is a benchmark, not a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_operator.bench.cli import bench_main
from specdec_operator.bench.report import is_shifting
from specdec_runtime.simulator.profile import load_profile

TINY = """\
acceptance: [0.8, 0.6, 0.48, 0.42]
step_time: {base_s: 0.022, per_token_s: 0.00012, draft_base_s: 0.002, draft_per_token_s: 0.00002}
load:
  - {duration_s: 300, concurrency: 32}
  - {duration_s: 300, concurrency: 2}
restart_s: 2
replicas: 2
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_json_report_has_tuner_static_and_summary(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["tuner", "--profile", f"{tiny}:eagle3:gfx942", "--max-k", "6", "--jobs", "1", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    (profile,) = report["profiles"]
    assert profile["profile"] == "tiny.yaml" and profile["shifting"] is True
    assert set(profile["static_tokens"]) == {str(k) for k in range(7)}
    assert profile["tuner_tokens"] > 0 and profile["duration_s"] == 600
    assert profile["best_static_k"] == max(range(7), key=lambda k: profile["static_tokens"][str(k)])
    assert set(report["summary"]["checks"]) and "targets_met" in report["summary"]


def test_table_output_names_every_column(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["tuner", "--profile", str(tiny), "--max-k", "6", "--jobs", "1", "--duration", "300"]) == 0
    out = capsys.readouterr().out
    assert "tiny.yaml*" in out and "/best" in out and "K over time" in out and "geomean" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tuner", "--profile", "/nonexistent.yaml"], "cannot read"),
        (["tuner", "--profile", "x.yaml:medusa"], "unknown drafter method"),
        (["tuner", "--min-k", "4", "--initial-k", "2"], "--min-k <= --initial-k"),
    ],
)
def test_bad_arguments_are_one_clear_error(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(argv) == 2
    assert message in capsys.readouterr().err


def test_committed_profiles_load_and_the_shifting_ones_are_recognised() -> None:
    profiles = Path(__file__).resolve().parents[3] / "runtime" / "specdec_runtime" / "profiles"
    shifting = {path.name for path in profiles.glob("bench-*.yaml") if is_shifting(load_profile(path))}
    assert shifting == {"bench-load-flips.yaml", "bench-load-shift.yaml", "bench-mix-shift.yaml"}
    assert len(list(profiles.glob("bench-*.yaml"))) == 10
