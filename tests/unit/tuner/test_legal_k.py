"""Legal K: the tuner stays inside the Ks vLLM 0.33 starts a pool's drafter with (mtp: up to its MTP layer
count, or a multiple of it), from the pure function through the policy to TunerState."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.api.spec import Autotune, Speculation
from specdec_operator.decisions.legal_k import legal_ks, nearest_legal_k, next_legal_k
from specdec_operator.tuner.costmodel import StepCoefficients, StepPrediction
from specdec_operator.tuner.engine import PoolContext, TunerState
from specdec_operator.tuner.estimator import estimate_acceptance
from specdec_operator.tuner.policy import PoolEvidence, decide
from specdec_operator.tuner.samples import ScrapeResult, parse_metrics
from specdec_runtime.config import SpeculativeSettings
from specdec_runtime.simulator.profile import load_profile
from specdec_runtime.simulator.virtual import VirtualReplica
from tests.unit.tuner.factories import chain_delta, target

PROFILES = Path(__file__).resolve().parents[3] / "runtime" / "specdec_runtime" / "profiles"
STEP = StepCoefficients(base_s=0.022, per_token_s=0.00012, draft_base_s=0.0022, draft_per_token_s=0.00002)


def vllm_refuses_mtp(k: int, layers: int) -> bool:
    """vllm/config/speculative.py: `num_speculative_tokens > n_predict and num_speculative_tokens % n_predict != 0`."""
    return k > layers and k % layers != 0


@pytest.mark.parametrize(
    ("method", "layers", "bounds", "legal"),
    [
        ("mtp", 1, (0, 6), (0, 1, 2, 3, 4, 5, 6)),
        ("mtp", 2, (0, 8), (0, 1, 2, 4, 6, 8)),
        ("mtp", 3, (1, 10), (1, 2, 3, 6, 9)),
        ("mtp", 4, (5, 7), ()),
        ("mtp", None, (0, 4), (0,)),  # undeclared: speculation off only (admission refuses this spec)
        ("eagle3", None, (2, 5), (2, 3, 4, 5)),
        ("extract_hidden_states", None, (0, 3), (0, 1)),
    ],
)
def test_legal_ks(method: str, layers: int | None, bounds: tuple[int, int], legal: tuple[int, ...]) -> None:
    assert legal_ks(method, layers, *bounds) == legal


def test_nearest_and_next_legal_k() -> None:
    legal = (0, 1, 2, 4, 6, 8)
    assert [nearest_legal_k(k, legal) for k in (3, 5, 7, 9)] == [2, 4, 6, 8]
    assert nearest_legal_k(3, ()) is None
    assert (next_legal_k(2, legal, upwards=True), next_legal_k(4, legal, upwards=False)) == (4, 2)
    assert next_legal_k(8, legal, upwards=True) is None


def mtp_evidence(k: int, layers: int, acceptance: list[float], batch: float, samples: float) -> PoolEvidence:
    return PoolEvidence(
        pool="p",
        current_k=k,
        samples_at_k=samples,
        batch=batch,
        acceptance=estimate_acceptance({k: chain_delta(acceptance, k, 200_000.0)} if k else {}, "mtp"),
        steps={kk: StepPrediction(STEP.seconds(batch, kk), 0.01) for kk in range(17)},
        legal_ks=legal_ks("mtp", layers, 0, 16),
    )


@settings(max_examples=300, deadline=None)
@given(
    layers=st.integers(1, 5),
    k_seed=st.integers(0, 16),
    acceptance=st.lists(st.floats(0.05, 0.98), min_size=1, max_size=8),
    batch=st.floats(1.0, 256.0),
    bounds=st.tuples(st.integers(0, 16), st.integers(0, 16)).map(sorted),
    samples=st.sampled_from([10.0, 50_000.0]),
)
def test_the_policy_never_proposes_an_mtp_k_vllm_refuses(
    layers: int, k_seed: int, acceptance: list[float], batch: float, bounds: list[int], samples: float
) -> None:
    min_k, max_k = bounds
    spec = Speculation(initial_k=min_k, min_k=min_k, max_k=max_k, autotune=Autotune(min_samples=1000))
    pool = mtp_evidence(k_seed, layers, acceptance, batch, samples)  # any current K, legal or not
    outcome = decide([pool], spec, now=10_000.0, last_change_at=None)
    decision = outcome.assessments[0].decision
    if decision.action != "Hold":
        assert min_k <= decision.to_k <= max_k
        assert not vllm_refuses_mtp(decision.to_k, layers), decision.reason
    assert all(not vllm_refuses_mtp(c.k, layers) for c in outcome.assessments[0].candidates)


def test_an_illegal_current_k_is_moved_to_the_nearest_legal_one() -> None:
    spec = Speculation(initial_k=2, min_k=0, max_k=8)
    decision = decide([mtp_evidence(5, 2, [0.8], 32.0, 50_000.0)], spec, now=1.0, last_change_at=None).decision
    assert decision is not None and (decision.action, decision.to_k) == ("Change", 4)
    assert "K=5 is not a K vLLM accepts for this drafter" in decision.reason


def test_tuner_state_keeps_an_mtp_pool_inside_its_legal_ks() -> None:
    """The e2e-opt-k7 profile's optimum is K=7; with 2 MTP layers vLLM refuses 7, so the tuner must settle on
    a multiple of 2 (or a K <= 2) and never ask for 7."""
    autotune = Autotune(interval_seconds=15, cooldown_seconds=60, min_samples=1000)
    spec = Speculation(initial_k=4, min_k=0, max_k=10, autotune=autotune)
    profile = load_profile(PROFILES / "e2e-opt-k7.yaml")
    state, k, t, proposed = TunerState(), 4, 0.0, []
    for _ in range(40):
        pool = PoolContext(name="p", gfx_target="gfx942", drafter_method="mtp", effective_k=k, drafter_mtp_layers=2)
        settings_k = SpeculativeSettings(method="mtp", num_speculative_tokens=k)
        replica = VirtualReplica(profile, settings_k, model_name="m", seed=k)
        start = t
        for _ in range(12):
            t += 5.0
            replica.advance_to(profile.restart_s + t - start)
            state.observe([pool], [ScrapeResult(target(k=k), t, "ok", parse_metrics(replica.metrics_text()))])
        report = state.evaluate(t, [pool], spec)
        if report.decision is not None:
            proposed.append(report.decision.to_k)
            k = report.decision.to_k
            t += autotune.cooldown_seconds
    assert proposed, "the tuner never moved from K=4"
    assert all(not vllm_refuses_mtp(to_k, 2) for to_k in proposed), proposed
    assert k in (6, 8)
