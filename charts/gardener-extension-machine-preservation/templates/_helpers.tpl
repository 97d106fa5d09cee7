{{/* Names. One installation per extension namespace, so the namespaced objects have fixed names (as Gardener's
     extensions name theirs); the cluster-scoped ones carry the release name (= the registration's name), the
     one thing that tells two registrations of this chart in one seed apart. */}}
{{- define "gemp.name" -}}gardener-extension-machine-preservation{{- end -}}
{{- define "gemp.controller.name" -}}{{ include "gemp.name" . }}{{- end -}}
{{- define "gemp.webhook.name" -}}{{ include "gemp.name" . }}-webhook{{- end -}}
{{- define "gemp.certs.name" -}}{{ include "gemp.name" . }}-certs{{- end -}}
{{/* The certs manager's state (CA with key, trust bundle, serving pair): only the certs manager writes it, the
     controller reads the CA from it (--ca-secret). */}}
{{- define "gemp.certsSecret.name" -}}{{ include "gemp.webhook.name" . }}-certs{{- end -}}
{{/* Only tls.crt and tls.key, mounted by the webhook pods. */}}
{{- define "gemp.servingSecret.name" -}}{{ include "gemp.webhook.name" . }}-tls{{- end -}}
{{/* The seed's Machine ValidatingWebhookConfiguration: named after the release. Owned by the certs manager, which
     reads its manifest from a ConfigMap (key below) mounted at the path below. */}}
{{- define "gemp.configuration.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "gemp.seedWebhooks.configMap" -}}{{ include "gemp.name" . }}-seed-webhooks{{- end -}}
{{- define "gemp.seedWebhooks.key" -}}validatingwebhookconfiguration.yaml{{- end -}}
{{- define "gemp.seedWebhooks.dir" -}}/etc/machine-preservation/seed-webhooks{{- end -}}
{{/* Cluster-scoped RBAC: Gardener's prefix for extensions, the release, the component. */}}
{{- define "gemp.clusterRole.name" -}}extensions.gardener.cloud:{{ .root.Release.Name }}:{{ .component }}{{- end -}}

{{/* The webhook as every API server reaches it: the seed's through the Service reference, each shoot's (whose
     kube-apiserver runs in the seed) through this URL. */}}
{{- define "gemp.webhook.url" -}}
https://{{ include "gemp.webhook.name" . }}.{{ .Release.Namespace }}.svc:443
{{- end -}}

{{- /* The Service port of the seed's own webhooks (the seed-webhook container); 443 is the shoots'. */ -}}
{{- define "gemp.webhook.seedServicePort" -}}
8443
{{- end -}}

{{- define "gemp.controllerUsername" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gemp.controller.name" . }}
{{- end -}}

{{- define "gemp.labels" -}}
app.kubernetes.io/name: {{ include "gemp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gemp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gemp.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gemp.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Egress the seed's NetworkPolicy controller grants by pod label: DNS and the seed's API server for every pod. */}}
{{- define "gemp.seedEgressLabels" -}}
networking.gardener.cloud/to-dns: allowed
networking.gardener.cloud/to-runtime-apiserver: allowed
{{- end -}}

{{/* gardenlet sets SEED_NAME in every container of the ManagedResource it renders; set here too (same value), so
     the chart rendered without gardenlet behaves the same. */}}
{{- define "gemp.seedNameEnv" -}}
{{- with dig "seed" "name" "" .Values.gardener }}
- name: SEED_NAME
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The root filesystem is read-only: an in-memory /tmp for the kubernetes client's temporary files. */}}
{{- define "gemp.tmpVolume" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 8Mi
{{- end -}}
{{- define "gemp.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}
{{- define "gemp.tmpEnv" -}}
- name: TMPDIR
  value: /tmp
{{- end -}}

{{- define "gemp.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "gemp.antiAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gemp.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* CEL building blocks, the same expressions as charts/machine-preservation/templates/_helpers.tpl (mp.cel.*)
     and tests/webhook/configurations.py (tests/integration/test_gardener_chart.py compares them). */}}

{{- define "gemp.cel.string" -}}
'{{ . | replace "\\" "\\\\" | replace "'" "\\'" }}'
{{- end -}}

{{- define "gemp.cel.hasAnnotation" -}}
({{ .obj }} != null && has({{ .obj }}.metadata.annotations) && {{ include "gemp.cel.string" .key }} in {{ .obj }}.metadata.annotations)
{{- end -}}

{{- define "gemp.cel.annotationChanged" -}}
{{- $new := include "gemp.cel.hasAnnotation" (dict "obj" "object" "key" .) -}}
{{- $old := include "gemp.cel.hasAnnotation" (dict "obj" "oldObject" "key" .) -}}
{{- $quoted := include "gemp.cel.string" . -}}
({{ $new }} != {{ $old }} || ({{ $new }} && object.metadata.annotations[{{ $quoted }}] != oldObject.metadata.annotations[{{ $quoted }}]))
{{- end -}}

{{- define "gemp.cel.anyAnnotationChanged" -}}
{{- $parts := list -}}
{{- range . }}{{ $parts = append $parts (include "gemp.cel.annotationChanged" .) }}{{ end -}}
{{- join " || " $parts -}}
{{- end -}}

{{- define "gemp.cel.failed" -}}
({{ . }} != null && has({{ . }}.status) && has({{ . }}.status.currentStatus) && has({{ . }}.status.currentStatus.phase) && {{ . }}.status.currentStatus.phase == 'Failed')
{{- end -}}

{{- /* Failed, or carrying any key of our preservation record (core/vocabulary.py PRESERVATION_RECORD_ANNOTATIONS). */ -}}
{{- define "gemp.cel.failedOrPreserved" -}}
{{- $obj := . -}}
{{- $parts := list -}}
{{- range (list
  "node.machine.sapcloud.io/preserved-since"
  "node.machine.sapcloud.io/preserved-until"
  "node.machine.sapcloud.io/preserved-by"
  "node.machine.sapcloud.io/preserved-added-scale-down-disabled"
  "node.machine.sapcloud.io/preserved-drain"
  "node.machine.sapcloud.io/preserved-drain-failing-since"
  "node.machine.sapcloud.io/preserved-drain-last-attempt"
  "node.machine.sapcloud.io/preserved-announcement-pending"
  "node.machine.sapcloud.io/preserved-node-gone-since") }}{{ $parts = append $parts (include "gemp.cel.hasAnnotation" (dict "obj" $obj "key" .)) }}{{ end -}}
({{ include "gemp.cel.failed" $obj }} || {{ join " || " $parts }})
{{- end -}}

{{- /* Not marked for forced deletion (MCM's label; Gardener sets it on every machine of a Shoot it hibernates or
deletes, core/admission/deletion.py FORCE_DELETION_LABEL). */ -}}
{{- define "gemp.cel.notForceDeleted" -}}
!({{ . }} != null && has({{ . }}.metadata.labels) && 'force-deletion' in {{ . }}.metadata.labels && {{ . }}.metadata.labels['force-deletion'] == 'True')
{{- end -}}

{{/* The preserve annotation and the controller-owned markers (core/vocabulary.py). */}}
{{- define "gemp.preserveRelatedAnnotations" -}}
{{- list
  "node.machine.sapcloud.io/preserve"
  "node.machine.sapcloud.io/preserved-since"
  "node.machine.sapcloud.io/preserved-until"
  "node.machine.sapcloud.io/preserved-by"
  "node.machine.sapcloud.io/preserved-added-scale-down-disabled"
  "node.machine.sapcloud.io/preserved-drain"
  "node.machine.sapcloud.io/preserved-drain-failing-since"
  "node.machine.sapcloud.io/preserved-drain-last-attempt"
  "node.machine.sapcloud.io/preserved-announcement-pending"
  "node.machine.sapcloud.io/preserved-node-gone-since"
  "node.machine.sapcloud.io/preserved-drain-pods-left"
  "node.machine.sapcloud.io/preserved-drain-blocked-by"
  "node.machine.sapcloud.io/preserved-evidence"
  "node.machine.sapcloud.io/last-applied-node-preserve-value"
  "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm"
  "node.machine.sapcloud.io/scale-down-disabled-by-preservation"
  "node.machine.sapcloud.io/last-machine-priority"
  "node.machine.sapcloud.io/reported-invalid-preserve-values"
  | toJson -}}
{{- end -}}
