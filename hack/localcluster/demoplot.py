"""The demo's `--plot`: each pool's effective K and tokens/s over time, sampled from SpeculativeModel statuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specdec_operator.api.status import SpeculativeModelStatus

_LINE_STYLES = ("solid", (0, (6, 3)), (0, (2, 2)), (0, (6, 2, 2, 2)))


@dataclass(frozen=True)
class PoolPoint:
    effective_k: int
    tokens_per_second: float | None


def pool_points(models: list[dict[str, Any]]) -> dict[str, PoolPoint]:
    """`namespace/pool` -> what the operator reports for it now (status only, never the spec)."""
    points: dict[str, PoolPoint] = {}
    for obj in models:
        try:
            status = SpeculativeModelStatus.model_validate(obj.get("status") or {})
        except ValidationError:
            continue  # a status from another operator version: nothing to plot for it
        namespace = obj["metadata"]["namespace"]
        rates = {stats.pool: stats.tokens_per_second for stats in status.speculation.pools}
        for pool in status.pools:
            points[f"{namespace}/{pool.name}"] = PoolPoint(pool.effective_k, rates.get(pool.name))
    return points


@dataclass
class PoolHistory:
    """Samples per pool on one clock (seconds since the demo's models were applied)."""

    series: dict[str, list[tuple[float, PoolPoint]]] = field(default_factory=dict)

    def record(self, seconds: float, models: list[dict[str, Any]]) -> None:
        for pool, point in pool_points(models).items():
            self.series.setdefault(pool, []).append((seconds, point))

    def write_png(self, path: Path, title: str) -> None:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on CI machines or over SSH
        import matplotlib.pyplot as plt

        figure, (k_axis, rate_axis) = plt.subplots(2, 1, sharex=True, figsize=(11, 7), constrained_layout=True)
        for index, (pool, samples) in enumerate(sorted(self.series.items())):
            # Pools often share a K; distinct dashes keep a line visible under another at the same value.
            style = _LINE_STYLES[index % len(_LINE_STYLES)]
            times = [t for t, _ in samples]
            # K changes in steps when a rollout lands; a step plot shows when, not a fictitious slope.
            k_axis.step(times, [p.effective_k for _, p in samples], where="post", label=pool, linewidth=2,
                        linestyle=style)
            rated = [(t, p.tokens_per_second) for t, p in samples if p.tokens_per_second is not None]
            rate_axis.plot([t for t, _ in rated], [r for _, r in rated], label=pool, linestyle=style)
        k_axis.set_ylabel("effective K")
        k_axis.yaxis.get_major_locator().set_params(integer=True)
        k_axis.grid(True, alpha=0.3)
        # Beside the plots, not on them: a legend inside would hide the lines at the top of K's range.
        figure.legend(*k_axis.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
        k_axis.set_title(title)
        rate_axis.set_ylabel("tokens/s (pool)")
        rate_axis.set_xlabel("seconds since the models were applied")
        rate_axis.grid(True, alpha=0.3)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=110)
        plt.close(figure)
