"""specdec-operator: speculative-decoding vLLM on AMD ROCm fleets, with closed-loop tuning of K."""

GROUP = "specdec.io"
VERSION = "v1alpha1"
KIND = "SpeculativeModel"
PLURAL = "speculativemodels"
API_VERSION = f"{GROUP}/{VERSION}"
