{{- /*
The Shoot ValidatingWebhookConfiguration of the virtual garden, without caBundle. This file is the same in both
parts (tests/integration/test_gardener_admission_chart.py checks it): the application part renders it into the
virtual garden, and in generated mode the runtime part also hands it to the certificate loop (a ConfigMap), which
keeps the live configuration as it says, with the CA bundle. gardener-operator renders each part from its own chart
with the same values, so both render the same configuration.

Shoots of shoots with the extension enabled, when their preservation settings change (matchConditions), sent to the
runtime part by URL (the virtual garden's kube-apiserver has no Service of it). The label is set by
gardener-apiserver's ExtensionLabels admission plugin, which runs before validating webhooks and also labels shoots
whose extension is enabled by the registration's autoEnable; on UPDATE the old object's label counts too, so
disabling the extension is seen.
*/ -}}
{{- define "mpadm.shootWebhookConfiguration" -}}
{{- $g := .Values.global -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: gardener-extension-machine-preservation-admission
  labels:
    app.kubernetes.io/name: gardener-extension-machine-preservation-admission
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/component: admission
    app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
    app.kubernetes.io/managed-by: {{ .Release.Service }}
webhooks:
  - name: workers.shoots.machine-preservation.sapcloud.io
    clientConfig:
      url: {{ printf "%s/validate-shoot" (trimSuffix "/" $g.webhook.url) | quote }}
    rules:
      - apiGroups: [core.gardener.cloud]
        apiVersions: [v1beta1]
        operations: [CREATE, UPDATE]
        resources: [shoots]
        scope: "*"
    matchConditions:
      # A pool's preservation settings or their bound, or the extension's entry in spec.extensions: nothing else
      # (image or version updates, hibernation) reaches the webhook, so its outage never blocks them.
      - name: preservation-settings-change
        expression: {{ include "mpadm.cel.settingsChange" . | toJson }}
    failurePolicy: Fail
    matchPolicy: Equivalent
    sideEffects: None
    timeoutSeconds: {{ $g.webhook.timeoutSeconds }}
    admissionReviewVersions: [v1]
    objectSelector:
      matchLabels:
        extensions.extensions.gardener.cloud/machine-preservation: "true"
{{- end -}}

{{/* The CEL of the Shoot webhook, built as tests/webhook/configurations.py (shoot_webhook)
     and charts/machine-preservation build it; tests/integration/test_gardener_admission_chart.py
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
