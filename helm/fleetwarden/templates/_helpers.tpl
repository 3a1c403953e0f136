{{/*
Chart name, truncated to 63 characters because some Kubernetes name fields are limited to that
(DNS-1123 label).
*/}}
{{- define "fleetwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name prefix for every object of the release. The release name is used alone when
it already contains the chart name, so `helm install fleetwarden ...` yields `fleetwarden`, not
`fleetwarden-fleetwarden`.
*/}}
{{- define "fleetwarden.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The `helm.sh/chart` label value: chart name and version ("+" is not allowed in label values).
*/}}
{{- define "fleetwarden.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels on every object the chart creates.
*/}}
{{- define "fleetwarden.labels" -}}
helm.sh/chart: {{ include "fleetwarden.chart" . }}
{{ include "fleetwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetwarden
{{- end }}

{{/*
Selector labels: immutable in a Deployment's selector, so they must never include the version.
*/}}
{{- define "fleetwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The operator's ServiceAccount name. Without a created ServiceAccount an explicit name is required:
falling back to the namespace's `default` ServiceAccount would grant the operator's ClusterRole to
every pod that uses it.
*/}}
{{- define "fleetwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetwarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator image reference.
*/}}
{{- define "fleetwarden.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The sidecar image reference. The sidecar is the same Python package (`fleetwarden sidecar`), so by
default it is exactly the operator's image: one image to mirror, scan and pin.
*/}}
{{- define "fleetwarden.sidecarImage" -}}
{{- $repository := .Values.sidecar.image.repository | default .Values.image.repository }}
{{- $tag := .Values.sidecar.image.tag | default (.Values.image.tag | default .Chart.AppVersion) }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
