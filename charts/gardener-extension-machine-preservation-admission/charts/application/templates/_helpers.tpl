{{- define "mpadm.application.name" -}}gardener-extension-machine-preservation-admission{{- end -}}

{{- define "mpadm.application.labels" -}}
app.kubernetes.io/name: {{ include "mpadm.application.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
