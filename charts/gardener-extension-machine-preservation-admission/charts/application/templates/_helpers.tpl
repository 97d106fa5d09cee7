{{- define "mpadm.application.name" -}}gardener-extension-machine-preservation-admission{{- end -}}

{{- define "mpadm.application.labels" -}}
app.kubernetes.io/name: {{ include "mpadm.application.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The CEL of the Shoot webhook, built as core/machine_preservation/core/webhook_configurations.py
     (shoot_webhook) and charts/machine-preservation builds it; tests/integration/test_gardener_admission_chart.py
     checks the three are identical. */}}
{{- define "mpadm.cel.workersPresent" -}}
(has({{ . }}.spec) && has({{ . }}.spec.provider) && has({{ . }}.spec.provider.workers))
{{- end -}}

{{- define "mpadm.cel.extensionsPresent" -}}
(has({{ . }}.spec) && has({{ . }}.spec.extensions))
{{- end -}}

{{- define "mpadm.cel.settingsChange" -}}
{{- $new := include "mpadm.cel.workersPresent" "object" -}}
{{- $old := include "mpadm.cel.workersPresent" "oldObject" -}}
{{- $newExtensions := include "mpadm.cel.extensionsPresent" "object" -}}
{{- $oldExtensions := include "mpadm.cel.extensionsPresent" "oldObject" -}}
{{- printf "request.operation != 'UPDATE' || %s != %s || (%s && object.spec.provider.workers != oldObject.spec.provider.workers) || %s != %s || (%s && object.spec.extensions != oldObject.spec.extensions)" $new $old $new $newExtensions $oldExtensions $newExtensions -}}
{{- end -}}
