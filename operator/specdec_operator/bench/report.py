"""Per-profile results of the tuner benchmark, the summary against the targets, and the printed table."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdec_operator.bench.closedloop import BenchOptions, TunerRun
from specdec_runtime.simulator.profile import Profile

# Issue 6's acceptance targets for the benchmark.
TARGET_GEOMEAN_VS_BEST = 0.98
TARGET_FLOOR_VS_BEST = 0.95
TARGET_GEOMEAN_VS_K5 = 1.20
TARGET_SHIFTING_VS_BEST = 1.00
REFERENCE_K = 5


def is_shifting(profile: Profile) -> bool:
    """A profile whose load or acceptance changes over time (so no single K is best throughout)."""
    shapes = {(segment.concurrency, profile.kinds_for(segment)) for segment in profile.load}
    return len(shapes) > 1


@dataclass(frozen=True)
class ProfileResult:
    name: str
    drafter: str
    gfx_target: str
    shifting: bool
    tuner: TunerRun
    static_tokens: dict[int, int]

    @classmethod
    def build(
        cls, name: str, options: BenchOptions, profile: Profile, tuner: TunerRun, static_tokens: dict[int, int]
    ) -> ProfileResult:
        return cls(name, options.drafter, options.gfx_target, is_shifting(profile), tuner, static_tokens)

    @property
    def best_static_k(self) -> int:
        return max(self.static_tokens, key=lambda k: (self.static_tokens[k], -k))

    @property
    def vs_best(self) -> float:
        return self.tuner.tokens / self.static_tokens[self.best_static_k]

    @property
    def vs_reference(self) -> float | None:
        reference = self.static_tokens.get(REFERENCE_K)
        return self.tuner.tokens / reference if reference else None

    @property
    def restart_costs(self) -> list[float]:
        """The restart cost each K change was charged by the tuner (a fraction of goodput)."""
        return [c.restart_cost for c in self.tuner.changes if c.restart_cost is not None]

    @property
    def restart_share(self) -> float:
        """The share of the run's replica-time its K changes kept out of service (what they cost in tokens)."""
        pod_s = self.tuner.duration_s * self.tuner.replicas
        return self.tuner.restart_pod_s / pod_s if pod_s > 0 else 0.0

    def k_timeline(self) -> str:
        """The K over time, each change with the restart cost the tuner charged it (K@minute/cost)."""
        steps = [f"{self.tuner.initial_k}"]
        steps += [f"{c.to_k}@{c.at / 60:.0f}m" + ("" if c.restart_cost is None else f"/{c.restart_cost:.1%}")
                  for c in self.tuner.changes]
        return " > ".join(steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "drafter": self.drafter,
            "gfx_target": self.gfx_target,
            "shifting": self.shifting,
            "duration_s": self.tuner.duration_s,
            "tuner_tokens": self.tuner.tokens,
            "k_changes": len(self.tuner.changes),
            "restart_share": round(self.restart_share, 5),
            "converged_at_s": self.tuner.converged_at,
            "final_k": self.tuner.final_k,
            "k_over_time": [
                {"at_s": c.at, "from_k": c.from_k, "to_k": c.to_k, "action": c.action, "reason": c.reason,
                 "restart_cost": None if c.restart_cost is None else round(c.restart_cost, 5)}
                for c in self.tuner.changes
            ],
            "static_tokens": {str(k): tokens for k, tokens in sorted(self.static_tokens.items())},
            "best_static_k": self.best_static_k,
            "tuner_vs_best_static": round(self.vs_best, 4),
            "tuner_vs_static_k5": None if self.vs_reference is None else round(self.vs_reference, 4),
            "scrape_events": self.tuner.scrape_events,
        }


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def aggregate_results(results: list[ProfileResult]) -> dict[str, Any]:
    vs_best = [r.vs_best for r in results]
    vs_reference = [ratio for r in results if (ratio := r.vs_reference) is not None]
    shifting = [r.vs_best for r in results if r.shifting]
    geomean_best, geomean_reference = _geomean(vs_best), _geomean(vs_reference)
    checks = {
        f"geomean vs best static >= {TARGET_GEOMEAN_VS_BEST}": geomean_best is not None
        and geomean_best >= TARGET_GEOMEAN_VS_BEST,
        f"every profile vs best static >= {TARGET_FLOOR_VS_BEST}": all(v >= TARGET_FLOOR_VS_BEST for v in vs_best),
        f"geomean vs static K={REFERENCE_K} >= {TARGET_GEOMEAN_VS_K5}": geomean_reference is not None
        and geomean_reference >= TARGET_GEOMEAN_VS_K5,
        f"shifting profiles vs best static >= {TARGET_SHIFTING_VS_BEST}": all(
            v >= TARGET_SHIFTING_VS_BEST for v in shifting
        ),
    }
    return {
        "geomean_vs_best_static": None if geomean_best is None else round(geomean_best, 4),
        "min_vs_best_static": round(min(vs_best), 4) if vs_best else None,
        "geomean_vs_static_k5": None if geomean_reference is None else round(geomean_reference, 4),
        "checks": checks,
        "targets_met": all(checks.values()),
    }


def format_table(results: list[ProfileResult], summary: dict[str, Any]) -> str:
    header = (
        f"{'profile':<26} {'hours':>5} {'tuner Mtok':>10} {'best K':>6} {'best Mtok':>9} {'K5 Mtok':>8} "
        f"{'/best':>6} {'/K5':>6} {'chg':>3} {'rcost':>6} {'lost':>5} {'conv':>6}  K over time (K@min/restart cost)"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        reference = r.static_tokens.get(REFERENCE_K)
        name = r.name + ("*" if r.shifting else "")
        lines.append(
            f"{name:<26} {r.tuner.duration_s / 3600:>5.1f} {r.tuner.tokens / 1e6:>10.2f} "
            f"{r.best_static_k:>6} {r.static_tokens[r.best_static_k] / 1e6:>9.2f} "
            f"{'-' if reference is None else f'{reference / 1e6:.2f}':>8} {r.vs_best:>6.3f} "
            f"{'-' if r.vs_reference is None else f'{r.vs_reference:.3f}':>6} {len(r.tuner.changes):>3} "
            f"{_mean_cost(r.restart_costs):>6} {r.restart_share:>5.1%} {r.tuner.converged_at / 60:>5.0f}m  "
            f"{r.k_timeline()}"
        )
    lines.append("")
    lines.append("static K -> Mtokens:")
    for r in results:
        lines.append(f"  {r.name:<24} " + " ".join(f"{k}={t / 1e6:.1f}" for k, t in sorted(r.static_tokens.items())))
    lines.append(
        f"geomean tuner/best-static {summary['geomean_vs_best_static']}, min {summary['min_vs_best_static']}, "
        f"geomean tuner/static-K{REFERENCE_K} {summary['geomean_vs_static_k5']}   (* = shifting profile)"
    )
    lines.append(
        "rcost: the mean restart cost the tuner charged its K changes (added to minGain); lost: the share of "
        "replica-time its K changes kept out of service, already taken from its tokens (static K restarts nothing)"
    )
    lines += [f"  [{'ok' if passed else 'MISSED'}] {name}" for name, passed in summary["checks"].items()]
    return "\n".join(lines) + "\n"


def _mean_cost(costs: list[float]) -> str:
    return f"{sum(costs) / len(costs):.1%}" if costs else "-"
