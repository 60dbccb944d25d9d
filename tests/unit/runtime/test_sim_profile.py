"""Profile files: YAML and JSON, and errors that name the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_runtime.simulator.profile import ProfileError, load_profile

PROFILES_DIR = Path(__file__).parents[3] / "runtime" / "specdec_runtime" / "profiles"
MINIMAL = {
    "acceptance": [0.7],
    "step_time": {"base_s": 0.01, "per_token_s": 0.0001},
    "load": [{"duration_s": 60, "concurrency": 4}],
}


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_profiles_load(path: Path) -> None:
    assert load_profile(path).load


def test_json_and_yaml_give_the_same_profile(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(MINIMAL))
    (tmp_path / "p.yaml").write_text("acceptance: [0.7]\nstep_time: {base_s: 0.01, per_token_s: 0.0001}\n"
                                     "load: [{duration_s: 60, concurrency: 4}]\n")
    profile = load_profile(tmp_path / "p.json")
    assert profile == load_profile(tmp_path / "p.yaml")
    assert (profile.restart_s, profile.replicas, profile.faults.error_rate) == (120.0, 1, 0.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"acceptance": [1.5]}, "acceptance.0"),
        ({"load": [{"duration_s": 0, "concurrency": 4}]}, "load.0.duration_s"),
        ({"step_time": {"base_s": 0.01}}, "step_time.per_token_s"),
        ({"restart": 5}, "restart"),
        ({"faults": {"error_rate": 2}}, "faults.error_rate"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, change: dict[str, object], field: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**MINIMAL, **change}))
    with pytest.raises(ProfileError, match=f"profile {path}: field {field}:"):
        load_profile(path)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("acceptance: [0.7\n")
    with pytest.raises(ProfileError, match=f"profile {broken}: not valid yaml"):
        load_profile(broken)
