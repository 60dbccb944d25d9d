"""CounterWindows: deltas between scrapes, resets recognised, bad scrapes never counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.tuner.samples import MetricsParseError, ScrapeResult, parse_metrics
from specdec_operator.tuner.window import CounterWindows, WindowDelta, WindowKey
from tests.unit.tuner.factories import metrics_text, ok, target


def test_the_first_scrape_is_a_baseline_and_the_second_gives_the_increase() -> None:
    windows = CounterWindows()
    first = windows.observe([ok(metrics_text(drafts=1000, per_position=(800, 600, 450)), at=0.0)])
    assert first.deltas == {}
    assert first.events["baseline"] == 1
    second = windows.observe([ok(metrics_text(drafts=3000, per_position=(2400, 1800, 1350)), at=15.0)])
    delta = second.deltas[WindowKey("p", "r1", 3)]
    assert (delta.drafts, delta.draft_tokens, delta.accepted) == (2000, 6000, 3700)
    assert delta.accepted_per_position == (1600, 1200, 900)
    assert delta.pod_seconds == 15.0
    assert delta.mean_step_s == pytest.approx(0.03)
    assert delta.generation_tokens == 5700


def _scrape(drafts: float, at: float, *, k: int = 3, restart_count: int = 0, created: float = 100.0) -> ScrapeResult:
    per_position = tuple(drafts * rate for rate in (0.8, 0.6, 0.45, 0.3)[:k])
    return ok(
        metrics_text(drafts=drafts, per_position=per_position, created=created),
        at,
        target(k=k, restart_count=restart_count),
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, "reset_counter_decrease"),
        ({"created": 200.0}, "reset_created"),
        ({"restart_count": 1}, "reset_restart_count"),
        ({"k": 2}, "reset_k_changed"),
    ],
    ids=["counter-decrease", "created-changed", "restart-count", "k-changed"],
)
def test_a_reset_sets_a_new_baseline_and_the_next_scrape_counts_from_it(changes: dict[str, float], reason: str) -> None:
    windows = CounterWindows()
    windows.observe([_scrape(1000, 0.0)])
    restarted = windows.observe([_scrape(100, 30.0, **changes)])  # type: ignore[arg-type]
    assert restarted.deltas == {}
    assert restarted.events[reason] == 1
    later = windows.observe([_scrape(150, 45.0, **changes)])  # type: ignore[arg-type]
    assert [delta.drafts for delta in later.deltas.values()] == [50]


def _counts(drafts: float) -> str:
    """A pod's counters after `drafts` drafts at K=3, as vLLM counts them (each position at most once a draft)."""
    return metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts, 0.45 * drafts))


def test_a_new_pod_uid_starts_its_own_baseline() -> None:
    windows = CounterWindows()
    windows.observe([ok(metrics_text(drafts=1000), 0.0, target("a"))])
    report = windows.observe([ok(_counts(50), 15.0, target("b"))])
    assert report.deltas == {}
    assert report.events["baseline"] == 1


def test_failed_and_incomplete_scrapes_keep_the_baseline_so_the_next_delta_spans_the_gap() -> None:
    windows = CounterWindows()
    windows.observe([ok(metrics_text(drafts=1000), 0.0)])
    broken = parse_metrics(metrics_text(drafts=9_999_999).replace('position="1"', 'position="7"'))
    report = windows.observe(
        [
            ScrapeResult(target(), 15.0, "timeout", error="slow"),
            ScrapeResult(target(), 20.0, "incomplete", broken),
        ]
    )
    assert report.deltas == {}
    assert report.events["timeout"] == 1 and report.events["incomplete"] == 1
    later = windows.observe([ok(metrics_text(drafts=4000, per_position=(3200, 2400, 1800)), 30.0)])
    assert later.deltas[WindowKey("p", "r1", 3)].drafts == 3000
    assert later.deltas[WindowKey("p", "r1", 3)].pod_seconds == 30.0


def test_pods_of_one_key_are_summed_and_pool_and_revision_split_keys() -> None:
    windows = CounterWindows()
    pods = [target("a"), target("b"), target("c", revision="r2")]
    windows.observe([ok(_counts(100), 0.0, pod) for pod in pods])
    report = windows.observe([ok(_counts(300), 15.0, pod) for pod in pods])
    assert report.deltas[WindowKey("p", "r1", 3)].drafts == 400
    assert report.deltas[WindowKey("p", "r2", 3)].drafts == 200


def test_forget_except_drops_pods_that_are_gone() -> None:
    windows = CounterWindows()
    windows.observe([ok(_counts(100), 0.0, target("a"))])
    windows.forget_except([])
    assert windows.observe([ok(_counts(300), 15.0, target("a"))]).events["baseline"] == 1


def test_scaling_and_adding_deltas() -> None:
    delta = WindowDelta(drafts=10, accepted_per_position=(4.0, 2.0), pod_seconds=10, itl_sum=80, itl_count=100)
    assert delta.scaled(0.5).drafts == 5
    assert delta.plus(WindowDelta(drafts=1, accepted_per_position=(1.0,))).accepted_per_position == (5.0, 2.0)
    assert delta.mean_batch == 8.0
    assert WindowDelta(pod_seconds=10, running_seconds=30).mean_batch == 3.0
    assert WindowDelta().mean_batch is None


_TEXTS = st.one_of(
    st.builds(lambda d: metrics_text(drafts=d, per_position=(d * 0.8, d * 0.6, d * 0.45)), st.integers(0, 10**6)),
    st.builds(lambda d: metrics_text(drafts=d, per_position=(d * 0.5,)), st.integers(0, 10**6)),
    st.builds(lambda cut: metrics_text()[:cut], st.integers(0, 4000)),
    st.text(max_size=200),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_TEXTS, st.sampled_from(["ok", "timeout", "http_error"]), st.integers(0, 2)), max_size=12))
def test_any_sequence_of_scrapes_never_raises_and_never_yields_negative_counts(
    scrapes: list[tuple[str, str, int]],
) -> None:
    windows = CounterWindows()
    for step, (text, outcome, restarts) in enumerate(scrapes):
        try:
            sample = parse_metrics(text)
        except MetricsParseError:
            result = ScrapeResult(target(restart_count=restarts), float(step), "parse_error")
        else:
            status = "ok" if outcome == "ok" and sample.complete else ("incomplete" if outcome == "ok" else outcome)
            result = ScrapeResult(
                target(restart_count=restarts, k=sample.k),
                float(step),
                status,  # type: ignore[arg-type]
                sample if outcome == "ok" else None,
            )
        for delta in windows.observe([result]).deltas.values():
            assert (
                min(
                    delta.drafts,
                    delta.accepted,
                    delta.generation_tokens,
                    delta.itl_count,
                    *delta.accepted_per_position,
                    0.0,
                )
                >= 0.0
            )
            assert delta.pod_seconds > 0


def _without_per_position(text: str) -> str:
    """A vLLM that serves the spec-decode totals but not vllm:spec_decode_num_accepted_tokens_per_pos: K is read
    as draft tokens per draft, and a pod that has not drafted yet shows no K at all."""
    return "".join(line + "\n" for line in text.splitlines() if "_per_pos" not in line)


@pytest.mark.parametrize("annotated_k", [3, None], ids=["operator-annotation", "k-from-the-sample"])
def test_a_fresh_pod_without_per_position_counters_counts_its_first_interval(annotated_k: int | None) -> None:
    """Zero drafts read as K=0 and the first drafts as K=3: a "K change" that reset the window and lost every fresh
    pod's first interval. A K nothing shows yet is no change; only two known Ks that differ are."""
    windows = CounterWindows()

    def scrape(drafts: float, at: float) -> ScrapeResult:
        text = _without_per_position(metrics_text(drafts=drafts, per_position=(0.8 * drafts, 0.6 * drafts,
                                                                                0.45 * drafts)))
        result = ok(text, at)
        return result if annotated_k is None else ok(text, at, target(k=annotated_k))

    fresh = scrape(0.0, 0.0)
    assert fresh.sample is not None and fresh.sample.complete and fresh.sample.spec is not None
    assert windows.observe([fresh]).events["baseline"] == 1
    report = windows.observe([scrape(100.0, 15.0)])
    assert not [event for event in report.events if event.startswith("reset")], report.events
    assert list(report.deltas) == [WindowKey("p", "r1", 3)]
    assert report.deltas[WindowKey("p", "r1", 3)].drafts == 100.0
    assert windows.observe([scrape(150.0, 30.0)]).deltas[WindowKey("p", "r1", 3)].drafts == 50.0


def test_per_position_counters_present_but_zero_show_k_and_the_first_interval_counts() -> None:
    windows = CounterWindows()
    windows.observe([ok(metrics_text(drafts=0.0, per_position=(0.0, 0.0, 0.0)), 0.0)])
    report = windows.observe([ok(_counts(100.0), 15.0)])
    assert report.deltas[WindowKey("p", "r1", 3)].drafts == 100.0


def test_an_interval_without_drafts_is_credited_to_the_pods_k_not_to_k0() -> None:
    """Requests and tokens a speculating pod counts before its first draft (prefill only, errors) are evidence of
    its K, as the operator set it: not of K=0, which the tuner reads as speculation off, and no K mismatch."""
    windows = CounterWindows()

    def scrape(tokens: float, at: float) -> ScrapeResult:
        text = _without_per_position(metrics_text(drafts=0.0, per_position=(0.0, 0.0, 0.0),
                                                  generation_tokens=tokens))
        return ok(text, at, target(k=3))

    windows.observe([scrape(0.0, 0.0)])
    report = windows.observe([scrape(40.0, 15.0)])
    assert list(report.deltas) == [WindowKey("p", "r1", 3)]
    assert report.deltas[WindowKey("p", "r1", 3)].generation_tokens == 40.0
    assert report.events["k_mismatch"] == 0


def test_two_known_ks_that_differ_are_still_a_change_without_per_position_counters() -> None:
    windows = CounterWindows()
    windows.observe([ok(_without_per_position(metrics_text(drafts=100.0, draft_tokens=300.0)), 0.0)])
    report = windows.observe([ok(_without_per_position(metrics_text(drafts=1000.0, draft_tokens=2100.0)), 15.0)])
    assert report.deltas == {}
    assert report.events["reset_k_changed"] == 1
