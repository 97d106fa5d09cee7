{{/* One installation per garden: fixed names, as Gardener's admission components name theirs. The application
     part's default webhook URL names the Service: keep the two in step. */}}
{{- define "mpadm.runtime.name" -}}gardener-extension-machine-preservation-admission{{- end -}}
{{- define "mpadm.runtime.tlsSecret" -}}
{{- required "global.certificate.secretName is required: an existing kubernetes.io/tls Secret with the serving certificate (never a value: see values.yaml)" .Values.global.certificate.secretName -}}
{{- end -}}

{{- define "mpadm.runtime.labels" -}}
app.kubernetes.io/name: {{ include "mpadm.runtime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "mpadm.runtime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mpadm.runtime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
{{- end -}}
