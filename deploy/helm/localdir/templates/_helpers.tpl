{{/*
The base name of every object: the release name, or release-chart when the
release name does not already contain "localdir".
*/}}
{{- define "localdir.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "localdir.controllerName" -}}
{{- printf "%s-controller" (include "localdir.fullname" .) -}}
{{- end -}}

{{- define "localdir.nodeName" -}}
{{- printf "%s-node" (include "localdir.fullname" .) -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "localdir.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of a component: call with (list . "controller"). */}}
{{- define "localdir.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of a component's objects: call with (list . "controller"). */}}
{{- define "localdir.componentLabels" -}}
{{ include "localdir.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference from an images.<x> value. */}}
{{- define "localdir.image" -}}
{{- printf "%s:%s" (required "images.*.repository is required" .repository) (required "images.*.tag is required" (toString .tag)) -}}
{{- end -}}

{{/* The restricted container securityContext of the controller pod. */}}
{{- define "localdir.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Leader election rules (--leader-election) in the release namespace. */}}
{{- define "localdir.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "watch", "list", "delete", "update", "create"]
{{- end -}}

{{/*
The ClusterRoleBinding and RoleBinding of one sidecar's rules to the
controller's ServiceAccount: call with (list . "external-provisioner").
*/}}
{{- define "localdir.sidecarBindings" -}}
{{- $ := index . 0 -}}
{{- $name := printf "%s-%s" (include "localdir.fullname" $) (index . 1) -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "localdir.componentLabels" (list $ "controller") | nindent 4 }}
subjects:
  - kind: ServiceAccount
    name: {{ include "localdir.controllerName" $ }}
    namespace: {{ $.Release.Namespace }}
roleRef:
  kind: ClusterRole
  name: {{ $name }}
  apiGroup: rbac.authorization.k8s.io
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "localdir.componentLabels" (list $ "controller") | nindent 4 }}
subjects:
  - kind: ServiceAccount
    name: {{ include "localdir.controllerName" $ }}
    namespace: {{ $.Release.Namespace }}
roleRef:
  kind: Role
  name: {{ $name }}
  apiGroup: rbac.authorization.k8s.io
{{- end -}}
