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

{{/*
The operator's rules on cluster-scoped objects: always in its ClusterRole.
*/}}
{{- define "fleetwarden.clusterRules" -}}
# RegionPools (cluster-scoped, shared by the ModelDeployments of every namespace): only read.
# The handlers are level-based event handlers, so Kopf writes no finalizers or progress
# annotations, and the operator never edits a user's spec.
- apiGroups: ["fleetwarden.dev"]
  resources: ["regionpools"]
  verbs: ["get", "list", "watch"]
# Their status subresource, where the operator reports allocations (merge patches only).
- apiGroups: ["fleetwarden.dev"]
  resources: ["regionpools/status"]
  verbs: ["get", "patch"]
# Kopf discovers namespaces and CRDs to know what it can watch, and follows their changes.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
The operator's rules on namespaced objects: in its ClusterRole when it watches every namespace,
in a Role per watched namespace otherwise (watchNamespaces), so it gets no rights elsewhere.
*/}}
{{- define "fleetwarden.namespacedRules" -}}
# ModelDeployments and TenantPolicies: only read (see RegionPools).
- apiGroups: ["fleetwarden.dev"]
  resources: ["modeldeployments", "tenantpolicies"]
  verbs: ["get", "list", "watch"]
# Their status subresources, where the operator reports what it planned and observed.
- apiGroups: ["fleetwarden.dev"]
  resources: ["modeldeployments/status", "tenantpolicies/status"]
  verbs: ["get", "patch"]
# Children carry an owner reference to their ModelDeployment with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift) allows only to clients
# that may update the owner's finalizers: without this every child create is refused (403).
- apiGroups: ["fleetwarden.dev"]
  resources: ["modeldeployments/finalizers"]
  verbs: ["update"]
# The serving Deployments the operator creates per ModelDeployment and region, and scales.
# (Its watches select app.kubernetes.io/managed-by=fleetwarden server-side; RBAC cannot.)
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Services (including the sidecars' metrics port) and ConfigMaps for the serving pods.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The sidecars' Secret (admin token, interaction-token key), one per ModelDeployment: created
# once and read back by name. Never listed or watched, so no other Secret is ever read.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Serving pods, listed by label when a serving Deployment's status changes, to push the
# fairness config to each ready sidecar. No watch: a cluster-wide pod watch is not needed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# Events about every action; Kopf posts them to the core v1 API only, always as new Events.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
