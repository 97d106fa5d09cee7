{{/* One installation per garden: fixed names, as Gardener's admission components name theirs. The application
     part's default webhook URL names the Service: keep the two in step. */}}
{{- define "mpadm.runtime.name" -}}gardener-extension-machine-preservation-admission{{- end -}}
{{/* Generated mode (no global.certificate.secretName): the certificate loop (certsName: its Deployment, identity
     and the Secret with the CA and its key) publishes only the serving pair to tlsSecret, which the server mounts.
     Existing-Secret mode: tlsSecret is the operator's Secret. */}}
{{- define "mpadm.runtime.generated" -}}{{- if not .Values.global.certificate.secretName -}}true{{- end -}}{{- end -}}
{{- define "mpadm.runtime.certsName" -}}{{ include "mpadm.runtime.name" . }}-certs{{- end -}}
{{- define "mpadm.runtime.tlsSecret" -}}
{{- .Values.global.certificate.secretName | default (printf "%s-tls" (include "mpadm.runtime.name" .)) -}}
{{- end -}}

{{- define "mpadm.runtime.labels" -}}
{{ include "mpadm.runtime.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "mpadm.runtime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mpadm.runtime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
{{- end -}}

{{/* The certificate loop's objects: their own component, so the server's Service and PodDisruptionBudget never
     select its pod. */}}
{{- define "mpadm.runtime.certsLabels" -}}
{{ include "mpadm.runtime.certsSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "mpadm.runtime.certsSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mpadm.runtime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: certs
{{- end -}}

{{/* gardener-operator's priority class for the garden runtime cluster wins over the value. */}}
{{- define "mpadm.runtime.priorityClass" -}}
{{- dig "runtimeCluster" "priorityClassName" "" (.Values.gardener | default dict) | default .Values.global.priorityClassName -}}
{{- end -}}
