{{/* The chart's name: "raysize", or nameOverride. */}}
{{- define "raysize.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of this release's objects that more than one release could share a scope
with: the cluster-scoped ones (ClusterRole, ClusterRoleBinding, the admission policies) and
the Role and RoleBinding in each watched namespace. The usual fullname: fullnameOverride,
else the release name when it contains the chart's name (release "raysize": "raysize", the
names deploy/ uses), else "<release>-<name>"; at most 63 characters (a label value's limit,
kept for every name). */}}
{{- define "raysize.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "raysize.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The stem of the names of the objects in the release's own namespace: "raysize" (the
Deployment raysize-worker, the ConfigMap raysize-config, the ServiceAccount raysize, as
deploy/ names them, whatever the release), or fullnameOverride, else nameOverride. */}}
{{- define "raysize.localName" -}}
{{- default (include "raysize.name" .) .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- end }}

{{- define "raysize.workerName" -}}
{{ include "raysize.localName" . }}-worker
{{- end }}

{{- define "raysize.configName" -}}
{{ include "raysize.localName" . }}-config
{{- end }}

{{/* The worker's ServiceAccount: serviceAccount.name, else the local name (raysize). */}}
{{- define "raysize.serviceAccountName" -}}
{{- default (include "raysize.localName" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The Secrets the worker reads (none is made by the chart): existingSecret, else
"<local name>-<suffix>" (raysize-temporal, raysize-temporal-tls, raysize-ray-token). */}}
{{- define "raysize.temporalSecret" -}}
{{- .Values.temporal.existingSecret | default (printf "%s-temporal" (include "raysize.localName" .)) }}
{{- end }}
{{- define "raysize.temporalTlsSecret" -}}
{{- .Values.temporal.tlsExistingSecret | default (printf "%s-temporal-tls" (include "raysize.localName" .)) }}
{{- end }}
{{- define "raysize.rayTokenSecret" -}}
{{- .Values.rayToken.existingSecret | default (printf "%s-ray-token" (include "raysize.localName" .)) }}
{{- end }}

{{/* The worker pods' selector (immutable in a Deployment: unchanged since 0.1). */}}
{{- define "raysize.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raysize.name" . }}
app.kubernetes.io/component: worker
{{- end }}

{{/* The labels every object carries (deploy/base: name and part-of), plus Helm's. */}}
{{- define "raysize.labels" -}}
app.kubernetes.io/name: {{ include "raysize.name" . }}
app.kubernetes.io/part-of: raysize
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Exactly what raysize's Kubernetes calls need: the rules of deploy/watched-namespace/role.yaml;
with observeOnly, deploy/components/observe-only's read rules (and Events) alone. */}}
{{- define "raysize.rules" -}}
{{- if .Values.observeOnly }}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch"]
{{- else }}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: [""]
  resources: ["pods/resize"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch", "patch"]
{{- if .Values.launchAtSize.enabled }}
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames: ["raysize-launch-sizes"]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}
{{- end }}

{{/* Reading Ray token Secrets (deploy/components/ray-token-secrets): get, by name, of the
Secrets in rayTokenSecrets.names, or of any. */}}
{{- define "raysize.rayTokenRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  {{- with .Values.rayTokenSecrets.names }}
  resourceNames: {{ toJson . }}
  {{- end }}
  verbs: ["get"]
{{- end }}

{{- define "raysize.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* the build ID of Worker Versioning: versioning.buildId, else the image tag */}}
{{- define "raysize.buildId" -}}
{{ .Values.versioning.buildId | default .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Values that cannot work together, refused by name before anything is rendered
(values.schema.json checks each value's type and range). */}}
{{- define "raysize.validate" -}}
{{- if and (not .Values.clusterWide) (not (compact .Values.watchNamespaces)) }}
{{- fail "watchNamespaces is empty: list the namespaces raysize watches, or set clusterWide=true to watch every namespace with a ClusterRole" }}
{{- end }}
{{- $m := .Values.metrics }}
{{- if and $m.podMonitor.enabled $m.serviceMonitor.enabled }}
{{- fail "metrics.podMonitor.enabled and metrics.serviceMonitor.enabled are both true: the worker would be scraped twice; choose one" }}
{{- end }}
{{- if and (not $m.enabled) (or $m.podMonitor.enabled $m.serviceMonitor.enabled .Values.monitoring.enabled .Values.monitoring.alerts.enabled) }}
{{- fail "metrics.enabled is false, but a PodMonitor, ServiceMonitor or the alerts (monitoring.*) need the worker's metrics endpoint: set metrics.enabled=true" }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.create is false: name the existing ServiceAccount the worker runs as in serviceAccount.name" }}
{{- end }}
{{- end }}
