{{/* Names and labels shared by every object of the chart. */}}

{{- define "stabletrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>" unless the release name already contains the chart name. */}}
{{- define "stabletrain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "stabletrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stabletrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stabletrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "stabletrain.labels" -}}
helm.sh/chart: {{ include "stabletrain.chart" . }}
{{ include "stabletrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stabletrain
{{- end -}}

{{- define "stabletrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stabletrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "stabletrain.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Name of the kopf peering object the replicas meet in. */}}
{{- define "stabletrain.peeringName" -}}
{{- include "stabletrain.fullname" . -}}
{{- end -}}

{{/* Who may reach the agent port of every job's pods (--agent-peers, JSON): the operator's
pods, and Prometheus when the chart's PodMonitor scrapes the agents. */}}
{{- define "stabletrain.agentPeers" -}}
{{- $operator := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "stabletrain.selectorLabels" . | fromYaml)) -}}
{{- $peers := list $operator -}}
{{- if .Values.podMonitor.enabled -}}
{{- $peers = append $peers (dict "namespaceSelector" .Values.networkPolicy.prometheus.namespaceSelector "podSelector" .Values.networkPolicy.prometheus.podSelector) -}}
{{- end -}}
{{- toJson $peers -}}
{{- end -}}

{{/* The agents' namespaces as a PodMonitor namespaceSelector. */}}
{{- define "stabletrain.agentNamespaceSelector" -}}
{{- if .Values.watchNamespaces -}}
matchNames:
{{- range .Values.watchNamespaces }}
  - {{ . }}
{{- end -}}
{{- else -}}
any: true
{{- end -}}
{{- end -}}

{{/* The label the operator puts on every training pod, valued with the job's name
(stabletrain_operator.naming.JOB_LABEL; fixed: the operator's pod index selects by it). */}}
{{- define "stabletrain.jobLabel" -}}
stabletrain.dev/job
{{- end -}}

{{/* Selector of the training pods: every pod carrying the job label. */}}
{{- define "stabletrain.agentSelector" -}}
matchExpressions:
  - key: {{ include "stabletrain.jobLabel" . }}
    operator: Exists
{{- end -}}

{{/* The job label as Prometheus' service discovery spells it. */}}
{{- define "stabletrain.agentJobMetaLabel" -}}
{{- printf "__meta_kubernetes_pod_label_%s" (regexReplaceAll "[^a-zA-Z0-9_]" (include "stabletrain.jobLabel" .) "_") -}}
{{- end -}}

{{- define "stabletrain.podMonitorName" -}}
{{- printf "%s-agents" (include "stabletrain.fullname" .) -}}
{{- end -}}
