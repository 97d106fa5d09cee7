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

{{- define "mpadm.cel.poolSettings" -}}
{{- $m := "w.machineControllerManager" -}}
({{ include "mpadm.cel.workersPresent" . }} ? {{ . }}.spec.provider.workers.map(w, [dyn(has(w.name) ? [w.name] : []), dyn(has({{ $m }}) && has({{ $m }}.autoPreserveFailedMachineMax) ? [{{ $m }}.autoPreserveFailedMachineMax] : []), dyn(has({{ $m }}) && has({{ $m }}.machinePreserveTimeout) ? [{{ $m }}.machinePreserveTimeout] : []), dyn(has(w.maximum) ? [w.maximum] : []), dyn(has(w.systemComponents) ? [w.systemComponents] : [])]) : [])
{{- end -}}

{{- define "mpadm.cel.preservationExtension" -}}
({{ include "mpadm.cel.extensionsPresent" . }} ? {{ . }}.spec.extensions.filter(e, has(e.type) && e.type == 'machine-preservation') : [])
{{- end -}}

{{- define "mpadm.cel.settingsChange" -}}
request.operation != 'UPDATE' || {{ include "mpadm.cel.poolSettings" "object" }} != {{ include "mpadm.cel.poolSettings" "oldObject" }} || {{ include "mpadm.cel.preservationExtension" "object" }} != {{ include "mpadm.cel.preservationExtension" "oldObject" }}
{{- end -}}
