{{/* The name of this release's objects that more than one release could share a scope
with: the cluster-scoped ones (ClusterRole, ClusterRoleBinding, the admission policies) and
the Role and RoleBinding in each watched namespace. The usual fullname: the release name
when it contains "raysize" (release "raysize": "raysize", the names deploy/ uses), else
"<release>-raysize"; at most 63 characters (a label value's limit, kept for every name). */}}
{{- define "raysize.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The labels every object carries (deploy/base: name and part-of), plus Helm's. */}}
{{- define "raysize.labels" -}}
app.kubernetes.io/name: raysize
app.kubernetes.io/part-of: raysize
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Exactly what raysize's Kubernetes calls need: the rules of deploy/watched-namespace/role.yaml. */}}
{{- define "raysize.rules" -}}
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
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}

{{- define "raysize.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* the build ID of Worker Versioning: versioning.buildId, else the image tag */}}
{{- define "raysize.buildId" -}}
{{ .Values.versioning.buildId | default .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
