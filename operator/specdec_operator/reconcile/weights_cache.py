"""Whether a new revision of the model's pods starts from cached weights: the WeightsCached condition (pure).

Every K change, and every other change of the pod template, starts new pods. Without a weights cache each of them
downloads the weights again (tens to hundreds of GB) before it serves, which is most of what a K change costs. The
operator cannot make a cache (only the cluster knows its storage classes), so it says when there is none, louder
while autotune is on: then the operator itself starts those downloads.
"""

from __future__ import annotations

from specdec_operator.api.pod import WEIGHTS_CACHE_MOUNT
from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.conditions import Finding
from specdec_operator.render.podspec import PodSettings, weights_cache_claim

HOW = ("set spec.runtime.weightsCache.claimName, or the chart value runtime.pod.weightsCacheClaim for every model "
       "(docs/runtime-pods.md, Weights cache)")


def weights_cache_finding(spec: SpeculativeModelSpec, settings: PodSettings) -> tuple[bool, Finding]:
    """(whether new pods start from weights already on a volume, the reason and words)."""
    if spec.runtime.simulate:
        return True, Finding("Simulated", "the simulator loads no weights")
    claim = weights_cache_claim(spec, settings)
    if claim:
        return True, Finding("CacheMounted", f"every revision mounts the weights cache claim {claim} at "
                                             f"{WEIGHTS_CACHE_MOUNT}: new pods start without downloading again")
    source = spec.model.source
    if source is not None and source.pvc_name:
        return True, Finding("WeightsOnVolume", f"the target's weights are on the claim {source.pvc_name} "
                                                "(spec.model.source.pvcName)")
    why = ("autotune is on, so each K change it makes restarts every pod of a pool, and each downloads the weights "
           "again before it serves" if spec.speculation.autotune.enabled else
           "every new revision downloads the weights again before it serves")
    return False, Finding("NoWeightsCache", f"no weights cache: {why}; {HOW}")
