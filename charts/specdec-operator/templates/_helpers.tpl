{{/* Names and labels shared by every template. */}}

{{- define "specdec-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specdec-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "specdec-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specdec-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "specdec-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdec-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "specdec-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specdec-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specdec-operator
{{- end -}}

{{- define "specdec-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Rules for the namespaced resources the operator works on. They go into a ClusterRole when the operator
watches the whole cluster (values.clusterWide), and into one Role per namespace of values.watchNamespaces.
Takes a dict with "root" (the chart context) and "clusterwide" (bool).
*/}}
{{- define "specdec-operator.namespacedRules" -}}
{{- $root := .root -}}
# Every verb below is one the operator's code sends; tests/unit/shipping/test_chart_rbac.py holds this
# list to the code and tests/e2e/test_rbac.py proves it is enough. No `get` on workloads: the reconcile
# reads its children from watch caches (kopf indices) and never fetches one by name.
# SpeculativeModels: kopf lists and watches them to drive reconciles; get re-reads one after a status write
# met a conflict (409) or lost its answer, since status writes carry a resourceVersion precondition; patch
# writes kopf's finalizer, its progress annotations and the removal of a used one-shot canary annotation.
# No create or delete: users (and Git) own these objects.
- apiGroups: ["specdec.io"]
  resources: ["speculativemodels"]
  verbs: ["get", "list", "watch", "patch"]
# Status subresource: observed pools, effective K, tuner decisions and canary state (a merge patch).
- apiGroups: ["specdec.io"]
  resources: ["speculativemodels/status"]
  verbs: ["patch"]
# Runtime pools and canaries. list and watch feed kopf's index of owned Deployments, which wakes a model's
# loop when one of its Deployments changes (rollout progress). Server-side apply is a PATCH that creates a missing object, which
# the API server authorises as create; delete removes canary Deployments after promotion or rollback. get:
# an object the watch cache does not hold as the model's is read once before its first apply, so one that
# someone else made under the same name is never taken over (ObjectNotOwned); the same for the kinds below.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Per-pool runtime ConfigMaps and Services: list and watch feed kopf's indices of owned objects
# (handlers/watches.py), which the reconcile reads instead of listing, and wake a model when one changes;
# applied like Deployments; stale ones of replaced revisions and removed pools are deleted.
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A PodDisruptionBudget per pool keeps voluntary evictions from emptying it; watched like the other owned
# objects; deleted with the pool.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pods are read only. list: a model's runtime pods (labelled) give the IPs to scrape vLLM's /metrics and
# probe /health, and their restarts; list and watch: kopf's pod index (handlers/register.py gpu_pods)
# caches every watched pod's amd.com/gpu request and scheduling state, so placement and rollouts count
# free GPUs. No get: nothing reads one pod by name.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# Events on SpeculativeModels: kopf posts core/v1 events (decisions, canary steps, warnings).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Canary traffic: the operator reads the HTTPRoute a model names (its weights and status.parents) and
# re-weights its backendRefs with a server-side apply; it never creates or deletes routes, which belong
# to the platform team.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "patch"]
# A route in another namespace is used only when a ReferenceGrant there lets the model's namespace refer to it.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["referencegrants"]
  verbs: ["list"]
{{- if and $root.Values.peering.enabled (not .clusterwide) }}
{{ include "specdec-operator.peeringRules" (dict "root" $root "resource" "kopfpeerings") }}
{{- end }}
{{- end -}}

{{/* Rules for kopf's peering objects; takes "root" and "resource" (kopfpeerings or clusterkopfpeerings). */}}
{{- define "specdec-operator.peeringRules" -}}
# Kopf peering: watch all peering objects (kopf lists them without a name filter) to see the peers.
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  verbs: ["list", "watch"]
# Keep-alives (and the removal of dead peers) are patched into our own peering object only; get lets
# the operator see at start-up whether the object exists before creating it.
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  resourceNames: [{{ .root.Values.peering.name | quote }}]
  verbs: ["get", "patch"]
# create cannot be narrowed to a name (the name is in the body); the operator creates its peering
# object at start-up when it is missing, because kopf only ever patches it.
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  verbs: ["create"]
{{- end -}}

{{/* Fail early on values that would run two active operators at once. */}}
{{- define "specdec-operator.validate" -}}
{{- include "specdec-operator.checkScope" . -}}
{{- if and (not .Values.peering.enabled) (gt (int .Values.replicaCount) 1) -}}
{{- fail "peering.enabled=false runs every replica as an active operator: set replicaCount to 1 or enable peering" -}}
{{- end -}}
{{- end -}}

{{/*
OperatorSettings as environment variables (prefix SPECDEC_; lists and maps as JSON). Every name here
is a field of specdec_operator.settings.OperatorSettings; a unit test holds the two together.
*/}}
{{- define "specdec-operator.settingsEnv" -}}
- name: SPECDEC_NAMESPACES
  value: {{ toJson .Values.watchNamespaces | quote }}
- name: SPECDEC_CLUSTER_WIDE
  value: {{ .Values.clusterWide | quote }}
- name: SPECDEC_GPU_DEVICES
  value: {{ toJson .Values.gpuDevices | quote }}
- name: SPECDEC_FIELD_MANAGER
  value: {{ .Values.fieldManager | quote }}
- name: SPECDEC_RUNTIME_IMAGES
  value: {{ toJson .Values.runtime.images | quote }}
- name: SPECDEC_IMAGE_TARGETS
  value: {{ toJson .Values.runtime.imageTargets | quote }}
- name: SPECDEC_SIMULATOR_IMAGE
  value: {{ .Values.runtime.simulatorImage | quote }}
- name: SPECDEC_RUNTIME_POD_SECURITY
  value: {{ .Values.runtime.pod.security | quote }}
- name: SPECDEC_RUNTIME_SUPPLEMENTAL_GROUPS
  value: {{ toJson .Values.runtime.pod.supplementalGroups | quote }}
- name: SPECDEC_RUNTIME_FS_GROUP
  value: {{ .Values.runtime.pod.fsGroup | quote }}
- name: SPECDEC_WEIGHTS_CACHE_CLAIM
  value: {{ .Values.runtime.pod.weightsCacheClaim | quote }}
- name: SPECDEC_RECONCILE_INTERVAL_SECONDS
  value: {{ .Values.reconcileIntervalSeconds | quote }}
- name: SPECDEC_FREEZE_ROLLOUTS
  value: {{ .Values.freezeRollouts | quote }}
- name: SPECDEC_MAX_CONCURRENT_ROLLOUTS
  value: {{ .Values.maxConcurrentRollouts | quote }}
- name: SPECDEC_NODE_MISSING_GRACE_SECONDS
  value: {{ .Values.nodeMissingGraceSeconds | quote }}
- name: SPECDEC_FLEET_AUDIT_INTERVAL_SECONDS
  value: {{ .Values.fleetAuditIntervalSeconds | quote }}
- name: SPECDEC_SCRAPE_INTERVAL_SECONDS
  value: {{ .Values.scrape.intervalSeconds | quote }}
- name: SPECDEC_SCRAPE_TIMEOUT_SECONDS
  value: {{ .Values.scrape.timeoutSeconds | quote }}
- name: SPECDEC_SCRAPE_CONCURRENCY
  value: {{ .Values.scrape.concurrency | quote }}
- name: SPECDEC_SCRAPE_LOOPBACK_ONLY
  value: {{ .Values.scrape.loopbackOnly | quote }}
- name: SPECDEC_KV_HEADROOM_FRACTION
  value: {{ .Values.kvHeadroomFraction | quote }}
- name: SPECDEC_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: SPECDEC_METRICS_AUTH
  value: {{ .Values.metrics.auth.enabled | quote }}
- name: SPECDEC_PEERING_NAME
  value: {{ .Values.peering.name | quote }}
- name: SPECDEC_STANDALONE
  value: {{ not .Values.peering.enabled | quote }}
- name: SPECDEC_SHARD
  value: {{ .Values.shard.name | quote }}
- name: SPECDEC_MODEL_SELECTOR
  value: {{ .Values.shard.modelSelector | quote }}
- name: SPECDEC_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
{{- end -}}

{{/*
Every watched namespace must exist before the install: the chart puts a Role and RoleBinding in each, and
Kubernetes refuses them in a namespace that is missing (`namespaces "inference" not found`). The chart does
not create them: a namespace holds the models, and uninstalling a release must never delete them. Checked
against the cluster with `lookup` when helm talks to one (kube-system always exists there); `helm template`
and client-side dry runs cannot look and skip the check.
*/}}
{{/*
Cluster-wide only when said explicitly: an empty watchNamespaces used to mean the whole cluster, where the
operator may delete ConfigMaps, Services and Deployments it owns and patch HTTPRoutes in every namespace.
*/}}
{{- define "specdec-operator.checkScope" -}}
{{- if and (empty .Values.watchNamespaces) (not .Values.clusterWide) -}}
{{- fail "watchNamespaces is empty and clusterWide is not true: list the namespaces the operator manages in watchNamespaces, or set clusterWide: true to let it manage SpeculativeModels (and delete the objects they own) in every namespace" -}}
{{- end -}}
{{- if and .Values.watchNamespaces .Values.clusterWide -}}
{{- fail "watchNamespaces lists namespaces and clusterWide is true: set one of them, not both" -}}
{{- end -}}
{{- end -}}

{{- define "specdec-operator.checkWatchNamespaces" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" -}}
{{- $missing := list -}}
{{- range $namespace := .Values.watchNamespaces -}}
{{- if not (lookup "v1" "Namespace" "" $namespace) -}}
{{- $missing = append $missing $namespace -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "watchNamespaces: namespace(s) %s do not exist; create them first (kubectl create namespace %s): the chart puts a Role and RoleBinding in each watched namespace and does not create namespaces" (join ", " $missing) (join " " $missing)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
