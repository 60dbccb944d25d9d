"""What the reconciler gathered about one SpeculativeModel before deciding anything."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_operator.canary.evidence import CanaryWindows
from specdec_operator.decisions.capacity import FleetClaims
from specdec_operator.gpu.devices import BUILTIN_DEVICES, DeviceTable
from specdec_operator.gpu.inventory import NodeGpus
from specdec_operator.reconcile.rollout_limit import RolloutsInFlight
from specdec_operator.render.podspec import DEFAULT_POD_SETTINGS, PodSettings
from specdec_operator.tuner.engine import TunerState


@dataclass(frozen=True)
class TuningInputs:
    """What the tuner and the canary analysis gathered for one pass (handlers/tuning.py `observe_tuning`).

    The scrape round already fed `state` and `windows` (a cache of counter windows, rebuilt from status after
    a restart); the pure decision (reconcile/tuning_policy.py) reads them with the times below and returns
    what to commit, which the handler commits only once status holds it.
    """

    state: TunerState
    windows: CanaryWindows
    now: float  # monotonic, from the injected clock: the tuner's windows and cooldown run on it
    next_evaluation_at: float  # monotonic; math.inf while autotune is off
    # Pools whose Deployments are rolling, or every pool while a canary is in flight: no K decision for them.
    rolling: frozenset[str] = frozenset()
    # (reason, message) of a Gateway that refused the model's HTTPRoute when it was last read (before this pass):
    # what the pass keeps if it cannot read the route (reconcile/route_status.py gathered_rejection).
    route_rejection: tuple[str, str] | None = None
    decision_id: str = ""  # the audit id a decision proposed this pass carries


@dataclass(frozen=True)
class ObservedModel:
    namespace: str
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Live owned objects, keyed by (kind, name).
    children: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    nodes: Sequence[NodeGpus] = ()
    # GPU claims of every pod the operator watches (all models, other workloads), for free-GPU counts.
    gpu_claims: FleetClaims = field(default_factory=FleetClaims)
    # The model's runtime pods as the watch cache keeps them (handlers/services/watches.py runtime_pod_view).
    pods: Sequence[Mapping[str, Any]] = ()
    # The HTTPRoute named by spec.rollout.canary.traffic.httpRouteRef as read this pass; route_read says it
    # was read (a model without the ref, or a caller that did not gather it, has nothing to judge).
    route: Mapping[str, Any] | None = None
    route_read: bool = False
    # Why the HTTPRoute could not be read this pass (forbidden, the API server unreachable): owned objects wait.
    route_error: str | None = None
    # The route is in another namespace and no ReferenceGrant there lets the model refer to it: not read.
    route_not_permitted: bool = False
    # False: the watch cache may not hold the model's owned objects and pods yet (a replica that resumed after a
    # pause, handlers/resync.py); what `children` and `pods` lack is then unknown, not absent.
    children_known: bool = True
    # Runtime pods whose /metrics vLLM cannot produce, left out of tuning and canary analysis (tuner/window.py):
    # (pod, why). The plan reports them in the Degraded condition.
    excluded_pod_metrics: tuple[tuple[str, str], ...] = ()
    # The tuner's and the canary's inputs for this pass; None when the model is not tuned or canaried (or the
    # caller gathered no scrape round): then no K is decided and no step judged.
    tuning: TuningInputs | None = None
    # Owned objects the API server refused on earlier attempts ("Kind/name: message"), and objects under our
    # names that someone else holds (handlers/writes.py), as known when the pass began.
    refusals: tuple[str, ...] = ()
    not_owned: tuple[str, ...] = ()
    # When the pass gathered, on the injected wall clock (RFC 3339, whole seconds): the pass's status stamps.
    now: str = ""
    # The other models of this install with a rollout in flight, against the fleet's limit
    # (reconcile/rollout_limit.py); None without a limit.
    rollouts_in_flight: RolloutsInFlight | None = None

    def children_of_kind(self, kind: str) -> list[Mapping[str, Any]]:
        return [body for (child_kind, _), body in sorted(self.children.items()) if child_kind == kind]


@dataclass(frozen=True)
class EventRecord:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class EvaluationSettings:
    """The slice of operator settings the pure evaluation needs."""

    runtime_images: Mapping[str, str]
    image_targets: Mapping[str, Sequence[str]]
    simulator_image: str
    kv_headroom_fraction: float
    pod: PodSettings = DEFAULT_POD_SETTINGS
    # How long a pool whose nodes stop matching keeps its objects, replicas and K (see decisions/absence.py).
    node_missing_grace_s: float = 300.0
    # The device table inventory, placement and the rendered affinity share (built-in + the gpuDevices setting).
    devices: DeviceTable = BUILTIN_DEVICES
    # This install's shard (settings.shard), named in every status it writes; "" when the fleet is not sharded.
    shard: str = ""
    # A fleet-wide change freeze (settings.freeze_rollouts): every model as with spec.rollout.freeze.
    freeze_rollouts: bool = False
