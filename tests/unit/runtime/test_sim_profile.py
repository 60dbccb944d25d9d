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
        ({"request_kinds": [{"share": 0, "acceptance": [0.5]}, {"share": 1, "acceptance": [0.5]}]},
         "request_kinds.0.share"),
        ({"request_kinds": [{"share": 1, "acceptance": [0.5]}, {"share": 1, "acceptance": [1.2]}]},
         "request_kinds.1.acceptance.0"),
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


@pytest.mark.parametrize(
    "change",
    [
        {"request_kinds": [{"share": 1, "acceptance": [0.9]}, {"share": 3, "acceptance": [0.3]}]},  # beside acceptance
        {"acceptance": None},  # neither
    ],
)
def test_acceptance_is_set_once_for_every_request_alike_or_per_kind(tmp_path: Path, change: dict[str, object]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**MINIMAL, **change}))
    with pytest.raises(ProfileError, match=r"set exactly one of acceptance .* and request_kinds"):
        load_profile(path)


def test_request_kinds_shares_are_normalised_and_a_segment_acceptance_serves_one_kind(tmp_path: Path) -> None:
    data = {**MINIMAL, "acceptance": None,
            "request_kinds": [{"share": 1, "acceptance": [0.9]}, {"share": 3, "acceptance": [0.3, 0.2]}],
            "load": [{"duration_s": 10, "concurrency": 1}, {"duration_s": 10, "concurrency": 1, "acceptance": [0.5]}]}
    path = tmp_path / "kinds.json"
    path.write_text(json.dumps({key: value for key, value in data.items() if value is not None}))
    profile = load_profile(path)
    assert profile.kinds_for(profile.load[0]) == ((0.25, (0.9,)), (0.75, (0.3, 0.2)))
    assert profile.kinds_for(profile.load[1]) == ((1.0, (0.5,)),)
