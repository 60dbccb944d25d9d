"""The pod contract between the operator and the runtime: labels, annotations, ports and mounts.

The operator renders pods with these; the launcher, the simulator and the fleet driver read them.
"""

MANAGED_BY = "specdec-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
RUNTIME_NAME = "specdec-runtime"

LABEL_MODEL = "specdec.io/model"
LABEL_POOL = "specdec.io/pool"
LABEL_GFX = "specdec.io/gfx-target"
LABEL_REVISION = "specdec.io/revision"
LABEL_TRACK = "specdec.io/track"  # "stable" or "canary"

ANNOTATION_SIMULATOR_PROFILE = "specdec.io/simulator-profile"
ANNOTATION_RUNTIME_CONFIG_HASH = "specdec.io/runtime-config-hash"
# The pod's proposal length, so scrapers know which K a pod's counters belong to without reading its config.
ANNOTATION_K = "specdec.io/num-speculative-tokens"

CONTAINER_NAME = "vllm"
PORT_NAME = "http"  # vLLM serves the API, /health and /metrics on one port
CONFIG_VOLUME = "runtime-config"
CONFIG_MOUNT_PATH = "/etc/specdec"
CONFIG_KEY = "runtime.json"
