{{/* Names ------------------------------------------------------------------------------------- */}}

{{- define "mp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "mp.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "mp.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mp.webhook.name" -}}{{ include "mp.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "mp.controller.name" -}}{{ include "mp.fullname" . | trunc 52 | trimSuffix "-" }}-controller{{- end -}}
{{- define "mp.certsSecret.name" -}}{{ include "mp.webhook.name" . }}-certs{{- end -}}
{{/* The certs manager (selfManaged mode): its Deployment and ServiceAccount. */}}
{{- define "mp.certs.name" -}}{{ include "mp.fullname" . | trunc 57 | trimSuffix "-" }}-certs{{- end -}}
{{/* The Secret the webhook pods mount: only tls.crt and tls.key (the certs manager's or cert-manager's). */}}
{{- define "mp.servingSecret.name" -}}{{ include "mp.webhook.name" . }}-tls{{- end -}}

{{/* Every container's writable directory for temporary files: the root filesystem is read-only, and the
     kubernetes client writes a kubeconfig's embedded certificates and keys to temporary files (in memory,
     as they include keys). TMPDIR names it for every library that asks. */}}
{{- define "mp.tmpDir" -}}/tmp{{- end -}}
{{- define "mp.tmpVolume" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 8Mi
{{- end -}}
{{- define "mp.tmpMount" -}}
- name: tmp
  mountPath: {{ include "mp.tmpDir" . }}
{{- end -}}
{{- define "mp.tmpEnv" -}}
- name: TMPDIR
  value: {{ include "mp.tmpDir" . }}
{{- end -}}

{{/* The name of an object outside the release namespace (cluster-scoped, or in `default` or the control
     namespace), unique per release AND namespace: "<name>.<release namespace>". Namespace names cannot contain
     a dot, so the part after the last dot tells the namespace and two releases never share a name (with
     "<name>-<namespace>", release "a-b" in "c" and release "a" in "b-c" would). */}}
{{- define "mp.uniqueName" -}}
{{- printf "%s.%s" .name .root.Release.Namespace -}}
{{- end -}}

{{/* The webhook configurations' name; a caBundle injector in another cluster is pointed at it. */}}
{{- define "mp.configuration.name" -}}
{{- include "mp.uniqueName" (dict "root" . "name" (include "mp.fullname" .)) -}}
{{- end -}}

{{/* The Lease the controller elects its leader on (a fixed name in the control namespace). */}}
{{- define "mp.controller.leaseName" -}}machine-preservation-controller{{- end -}}

{{- define "mp.labels" -}}
app.kubernetes.io/name: {{ include "mp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mp.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mp.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "mp.controlNamespace" -}}
{{ .Values.clusters.control.namespace | default .Release.Namespace }}
{{- end -}}

{{/* MCM's user names (JSON list). Empty: MCM's usual ServiceAccount in kube-system. values.schema.json requires
     them in a seed setup (a cluster reached by kubeconfig, or a caBundle injected into another cluster), where
     MCM runs as a ServiceAccount of the shoot's namespace. */}}
{{- define "mp.mcmUsernames" -}}
{{- .Values.webhook.mcmUsernames | default (list "system:serviceaccount:kube-system:machine-controller-manager") | toJson -}}
{{- end -}}

{{/* --mcm-native-preservation: auto, true or false (YAML may hand over a boolean). */}}
{{- define "mp.mcmNativePreservation" -}}
{{- .Values.mcmNativePreservation | toString -}}
{{- end -}}

{{/* Selector pinning a namespaced webhook to the control namespace, plus the user's own selector. Without it,
     every release's Machine webhooks would judge every namespace of the cluster. */}}
{{- define "mp.controlNamespaceSelector" -}}
{{- $selector := deepCopy (.selector | default dict) -}}
{{- $labels := merge (dict "kubernetes.io/metadata.name" (include "mp.controlNamespace" .root)) ($selector.matchLabels | default dict) -}}
{{- $_ := set $selector "matchLabels" $labels -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* An exec probe of the controller's health endpoints on 127.0.0.1 (JSON list): the image's Python, no
     extra tool; exits non-zero unless the answer is 2xx. */}}
{{- define "mp.controller.localProbe" -}}
{{- $url := printf "http://127.0.0.1:%v%s" .root.Values.controller.metricsPort .path -}}
{{- list "python" "-c" (printf "import urllib.request; urllib.request.urlopen(%s, timeout=4)" (squote $url)) | toJson -}}
{{- end -}}

{{/* The controller's username as the target/control API servers see it. */}}
{{- define "mp.controllerUsername" -}}
{{- .Values.webhook.controllerUsername | default (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "mp.controller.name" .)) -}}
{{- end -}}

{{/* Whether the chart renders each configuration kind. */}}
{{- define "mp.validating.enabled" -}}
{{- if or .Values.webhooks.nodes.register .Values.webhooks.machines.register .Values.webhooks.shoots.register }}true{{ end -}}
{{- end -}}
{{- define "mp.mutating.enabled" -}}
{{- if .Values.webhooks.nodes.register }}true{{ end -}}
{{- end -}}

{{/* Kubeconfig volume mount path of a remote cluster. */}}
{{- define "mp.kubeconfigPath" -}}
/etc/machine-preservation/{{ . }}/kubeconfig
{{- end -}}

{{/* CEL building blocks: must stay identical to tests/webhook/configurations.py (a test compares them). */}}

{{- define "mp.cel.string" -}}
'{{ . | replace "\\" "\\\\" | replace "'" "\\'" }}'
{{- end -}}

{{- define "mp.cel.hasAnnotation" -}}
({{ .obj }} != null && has({{ .obj }}.metadata.annotations) && {{ include "mp.cel.string" .key }} in {{ .obj }}.metadata.annotations)
{{- end -}}

{{- define "mp.cel.annotationChanged" -}}
{{- $new := include "mp.cel.hasAnnotation" (dict "obj" "object" "key" .) -}}
{{- $old := include "mp.cel.hasAnnotation" (dict "obj" "oldObject" "key" .) -}}
{{- $quoted := include "mp.cel.string" . -}}
({{ $new }} != {{ $old }} || ({{ $new }} && object.metadata.annotations[{{ $quoted }}] != oldObject.metadata.annotations[{{ $quoted }}]))
{{- end -}}

{{- define "mp.cel.anyAnnotationChanged" -}}
{{- $parts := list -}}
{{- range . }}{{ $parts = append $parts (include "mp.cel.annotationChanged" .) }}{{ end -}}
{{- join " || " $parts -}}
{{- end -}}

{{- define "mp.cel.usernameList" -}}
{{- $quoted := list -}}
{{- range (. | uniq | sortAlpha) }}{{ $quoted = append $quoted (include "mp.cel.string" .) }}{{ end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{- /* Our CA marker, or MCM's (its own preservation where it preserves natively; the webhook tells them apart). */ -}}
{{- define "mp.cel.preserved" -}}
{{- $marker := include "mp.cel.hasAnnotation" (dict "obj" . "key" "node.machine.sapcloud.io/scale-down-disabled-by-preservation") -}}
{{- $mcmMarker := include "mp.cel.hasAnnotation" (dict "obj" . "key" "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm") -}}
({{ $marker }} || {{ $mcmMarker }} || ({{ . }} != null && has({{ . }}.status) && has({{ . }}.status.conditions) && {{ . }}.status.conditions.exists(c, c.type == 'Preserved' && c.status == 'True')))
{{- end -}}

{{- define "mp.cel.failed" -}}
({{ . }} != null && has({{ . }}.status) && has({{ . }}.status.currentStatus) && has({{ . }}.status.currentStatus.phase) && {{ . }}.status.currentStatus.phase == 'Failed')
{{- end -}}

{{- /* Failed, or carrying any key of our preservation record (core/vocabulary.py PRESERVATION_RECORD_ANNOTATIONS). */ -}}
{{- define "mp.cel.failedOrPreserved" -}}
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
  "node.machine.sapcloud.io/preserved-node-gone-since") }}{{ $parts = append $parts (include "mp.cel.hasAnnotation" (dict "obj" $obj "key" .)) }}{{ end -}}
({{ include "mp.cel.failed" $obj }} || {{ join " || " $parts }})
{{- end -}}

{{- /* Not marked for forced deletion (MCM's label; Gardener sets it on every machine of a Shoot it hibernates or
deletes, core/admission/deletion.py FORCE_DELETION_LABEL). */ -}}
{{- define "mp.cel.notForceDeleted" -}}
!({{ . }} != null && has({{ . }}.metadata.labels) && 'force-deletion' in {{ . }}.metadata.labels && {{ . }}.metadata.labels['force-deletion'] == 'True')
{{- end -}}

{{- define "mp.cel.workersPresent" -}}
(has({{ . }}.spec) && has({{ . }}.spec.provider) && has({{ . }}.spec.provider.workers))
{{- end -}}

{{- define "mp.cel.extensionsPresent" -}}
(has({{ . }}.spec) && has({{ . }}.spec.extensions))
{{- end -}}

{{/* The Shoot webhook's matchCondition, as tests/webhook/configurations.py (shoot_webhook) builds it. */}}
{{- define "mp.cel.poolSettings" -}}
{{- $m := "w.machineControllerManager" -}}
({{ include "mp.cel.workersPresent" . }} ? {{ . }}.spec.provider.workers.map(w, [dyn(has(w.name) ? [w.name] : []), dyn(has({{ $m }}) && has({{ $m }}.autoPreserveFailedMachineMax) ? [{{ $m }}.autoPreserveFailedMachineMax] : []), dyn(has({{ $m }}) && has({{ $m }}.machinePreserveTimeout) ? [{{ $m }}.machinePreserveTimeout] : []), dyn(has(w.maximum) ? [w.maximum] : []), dyn(has(w.systemComponents) ? [w.systemComponents] : [])]) : [])
{{- end -}}

{{- define "mp.cel.preservationExtension" -}}
({{ include "mp.cel.extensionsPresent" . }} ? {{ . }}.spec.extensions.filter(e, has(e.type) && e.type == 'machine-preservation') : [])
{{- end -}}

{{- define "mp.cel.settingsChange" -}}
request.operation != 'UPDATE' || {{ include "mp.cel.poolSettings" "object" }} != {{ include "mp.cel.poolSettings" "oldObject" }} || {{ include "mp.cel.preservationExtension" "object" }} != {{ include "mp.cel.preservationExtension" "oldObject" }}
{{- end -}}

{{/* The preserve annotation and the controller-owned markers (core/vocabulary.py). */}}
{{- define "mp.preserveRelatedAnnotations" -}}
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

{{/* clientConfig for one path. */}}
{{- define "mp.clientConfig" -}}
{{- $root := .root -}}
{{- if $root.Values.webhooks.clientConfig.url }}
url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhooks.clientConfig.url) .path | quote }}
{{- else }}
service:
  namespace: {{ $root.Release.Namespace }}
  name: {{ include "mp.webhook.name" $root }}
  port: {{ $root.Values.webhook.service.port }}
  path: {{ .path }}
{{- end }}
{{- if eq $root.Values.certificates.mode "provided" }}
caBundle: {{ required "certificates.provided.caBundle is required in provided mode" $root.Values.certificates.provided.caBundle }}
{{- end }}
{{- end -}}

{{- define "mp.configurationAnnotations" -}}
{{- if eq .Values.certificates.mode "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "mp.webhook.name" . }}
{{- end }}
{{- end -}}

{{- define "mp.kubeconfigArg" -}}
{{- $secret := index .root.Values.clusters .cluster "kubeconfigSecret" -}}
{{- if $secret }}
- --{{ .flag }}={{ include "mp.kubeconfigPath" .cluster }}
{{- end }}
{{- end -}}

{{- define "mp.kubeconfigVolumes" -}}
{{- $root := .root -}}
{{- range .clusters }}
{{- $secret := index $root.Values.clusters . "kubeconfigSecret" }}
{{- if $secret }}
- name: kubeconfig-{{ . }}
  secret:
    secretName: {{ $secret }}
    items:
      - key: {{ $root.Values.clusters.kubeconfigKey }}
        path: kubeconfig
{{- end }}
{{- end }}
{{- end -}}

{{- define "mp.kubeconfigMounts" -}}
{{- $root := .root -}}
{{- range .clusters }}
{{- if index $root.Values.clusters . "kubeconfigSecret" }}
- name: kubeconfig-{{ . }}
  mountPath: /etc/machine-preservation/{{ . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* Arguments of `machine-preservation certs run` (the certs manager's Deployment). */}}
{{- define "mp.certsArgs" -}}
{{- $root := . -}}
{{- $self := .Values.certificates.selfManaged -}}
- certs
- run
- --secret={{ .Release.Namespace }}/{{ include "mp.certsSecret.name" . }}
- --serving-secret={{ .Release.Namespace }}/{{ include "mp.servingSecret.name" . }}
- --service={{ include "mp.webhook.name" . }}
- --namespace={{ .Release.Namespace }}
{{- with .Values.webhooks.clientConfig.url }}
- --extra-name={{ (split ":" (urlParse .).host)._0 }}
{{- end }}
{{- if include "mp.validating.enabled" . }}
- --webhook-configuration=validating/{{ include "mp.configuration.name" . }}
{{- end }}
{{- if include "mp.mutating.enabled" . }}
- --webhook-configuration=mutating/{{ include "mp.configuration.name" . }}
{{- end }}
{{- range $self.remoteConfigurations }}
{{- if not (index $root.Values.clusters .cluster "kubeconfigSecret") }}
{{- fail (printf "certificates.selfManaged.remoteConfigurations: clusters.%s.kubeconfigSecret must be set to reach %s/%s" .cluster .kind .name) }}
{{- end }}
- --webhook-configuration={{ .kind }}/{{ .name }}@{{ include "mp.kubeconfigPath" .cluster }}
{{- end }}
- --ca-validity={{ $self.caValidity }}
- --ca-rotate-before={{ $self.caRotateBefore }}
- --ca-overlap={{ $self.caOverlap }}
- --propagation-delay={{ $self.propagationDelay }}
- --serving-validity={{ $self.servingValidity }}
- --serving-renew-fraction={{ $self.servingRenewFraction }}
- --resync={{ $self.resync }}
{{- end -}}

{{/* Clusters whose kubeconfig the certs containers need (remote caBundle injection). */}}
{{- define "mp.certsClusters" -}}
{{- $clusters := list -}}
{{- if eq .Values.certificates.mode "selfManaged" }}
{{- range .Values.certificates.selfManaged.remoteConfigurations }}{{ $clusters = append $clusters .cluster }}{{ end }}
{{- end }}
{{- $clusters | uniq | sortAlpha | toJson -}}
{{- end -}}

{{- define "mp.affinity" -}}
{{- if .affinity }}
{{- toYaml .affinity }}
{{- else }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "mp.selectorLabels" (dict "root" .root "component" .component) | nindent 12 }}
{{- end }}
{{- end -}}

{{/* What the controller does in the target cluster: nodes (annotations, taint, Preserved condition), draining. */}}
{{- define "mp.controller.targetRules" -}}
# get: a Failed machine's Node is read past the cache before the controller moves the machine back to Running.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# list: the PodDisruptionBudgets of a namespace where one refused an eviction, named on the preserved Node.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list]
{{- end -}}

{{/* Events on Nodes: cluster-scoped objects, so they go to the `default` namespace (as the kubelet's do);
     get+patch count a repeated event up; list reads a failed node's Events into the evidence of its failure. */}}
{{- define "mp.controller.nodeEventRules" -}}
- apiGroups: [""]
  resources: [events]
  verbs: [create, get, list, patch]
{{- end -}}

{{/* The evidence of a failure: a ConfigMap per preserved Failed node in kube-system, created, read back when one
     is there already, patched (replaced, its expiry set or cleared), listed and deleted once expired. */}}
{{- define "mp.controller.evidenceRules" -}}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, delete, get, list, patch]
{{- end -}}

{{/* caBundle injection into this release's own webhook configurations, by name only. */}}
{{- define "mp.cabundleRules" -}}
{{- if include "mp.validating.enabled" . }}
- apiGroups: [admissionregistration.k8s.io]
  resources: [validatingwebhookconfigurations]
  resourceNames: [{{ include "mp.configuration.name" . }}]
  verbs: [get, patch]
{{- end }}
{{- if include "mp.mutating.enabled" . }}
- apiGroups: [admissionregistration.k8s.io]
  resources: [mutatingwebhookconfigurations]
  resourceNames: [{{ include "mp.configuration.name" . }}]
  verbs: [get, patch]
{{- end }}
{{- end -}}
