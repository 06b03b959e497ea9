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
