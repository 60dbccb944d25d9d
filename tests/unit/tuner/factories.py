"""Builders of vLLM 0.33 /metrics text and tuner inputs for the tuner unit tests."""

from __future__ import annotations

from collections.abc import Sequence

from specdec_operator.tuner.samples import ScrapeResult, ScrapeTarget, parse_metrics
from specdec_operator.tuner.window import WindowDelta

BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LABELS = 'engine="0",model_name="m"'


def _counter(name: str, value: float, created: float | None, labels: str = LABELS) -> list[str]:
    lines = [f"# HELP {name}_total help", f"# TYPE {name}_total counter", f"{name}_total{{{labels}}} {value}"]
    if created is not None:
        lines += [
            f"# HELP {name}_created help",
            f"# TYPE {name}_created gauge",
            f"{name}_created{{{labels}}} {created}",
        ]
    return lines


def _histogram(name: str, total: float, count: float, step_s: float) -> list[str]:
    lines = [f"# HELP {name} help", f"# TYPE {name} histogram"]
    for bound in BUCKETS:
        lines.append(f'{name}_bucket{{engine="0",le="{bound}",model_name="m"}} {count if step_s <= bound else 0.0}')
    lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {count}')
    lines += [f"{name}_count{{{LABELS}}} {count}", f"{name}_sum{{{LABELS}}} {total}"]
    return lines


def metrics_text(
    *,
    drafts: float = 1000.0,
    per_position: Sequence[float] | None = (800.0, 600.0, 450.0),
    draft_tokens: float | None = None,
    generation_tokens: float | None = None,
    running: float = 8.0,
    step_s: float = 0.03,
    created: float | None = 100.0,
    extra_lines: Sequence[str] = (),
) -> str:
    """A vLLM-like exposition. per_position=None means speculation off (no spec-decode families)."""
    lines = [
        "# HELP vllm:num_requests_running help",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{LABELS}}} {running}",
    ]
    accepted = sum(per_position) if per_position is not None else 0.0
    steps = drafts
    if per_position is not None:
        k = len(per_position)
        lines += _counter("vllm:spec_decode_num_drafts", drafts, created)
        lines += _counter(
            "vllm:spec_decode_num_draft_tokens", draft_tokens if draft_tokens is not None else drafts * k, created
        )
        lines += _counter("vllm:spec_decode_num_accepted_tokens", accepted, created)
        lines += [
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total help",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {value}'
            for i, value in enumerate(per_position)
        ]
    generated = generation_tokens if generation_tokens is not None else steps + accepted
    lines += _counter("vllm:generation_tokens", generated, created)
    lines += _histogram("vllm:inter_token_latency_seconds", steps * step_s, steps, step_s)
    lines += _histogram("vllm:request_time_per_output_token_seconds", 10 * step_s / 2, 10, step_s / 2)
    lines += list(extra_lines)
    return "\n".join(lines) + "\n"


def target(
    uid: str = "pod-a", *, k: int = 3, pool: str = "p", revision: str = "r1", restart_count: int = 0
) -> ScrapeTarget:
    return ScrapeTarget(
        pod=f"ns/{uid}",
        uid=uid,
        ip="127.0.0.1",
        port=8000,
        pool=pool,
        revision=revision,
        k=k,
        restart_count=restart_count,
    )


def ok(text: str, at: float, scrape_target: ScrapeTarget | None = None) -> ScrapeResult:
    sample = parse_metrics(text)
    return ScrapeResult(scrape_target or target(k=sample.k), at, "ok" if sample.complete else "incomplete", sample)


def chain_delta(
    acceptance: Sequence[float],
    k: int,
    drafts: float = 100_000.0,
    *,
    batch: float = 8.0,
    step_s: float = 0.03,
    seconds: float = 60.0,
) -> WindowDelta:
    """The exact expected counter increases of `drafts` drafts at K with conditional acceptances."""
    per_position, survive = [], drafts
    for i in range(k):
        survive *= acceptance[min(i, len(acceptance) - 1)]
        per_position.append(survive)
    return WindowDelta(
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=sum(per_position),
        accepted_per_position=tuple(per_position),
        generation_tokens=drafts + sum(per_position),
        pod_seconds=seconds,
        itl_sum=batch * seconds,
        itl_count=batch * seconds / step_s,
    )
