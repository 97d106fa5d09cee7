{{- /*
The seed's Machine webhooks, for every shoot namespace with the extension enabled (gardenlet labels those
extensions.gardener.cloud/machine-preservation=true). Rules, matchConditions, failure policy and timeout mirror
the Machine webhooks of charts/machine-preservation/templates/webhook-configurations.yaml; what differs is the
scope (all enabled shoot namespaces instead of one control namespace) and MCM's identity (one ServiceAccount per
shoot namespace instead of a list of names).

gardenlet hands the chart to the seed's gardener-resource-manager, which re-applies every object as rendered on
each sync and would wipe the caBundle each time (failurePolicy Fail: Machine requests refused until the next
injection). So the chart renders the configuration with `resources.gardener.cloud/ignore` (created once, never
updated, deleted with the installation) and puts this manifest into a ConfigMap too: the certs manager keeps the
live object as the manifest says, with the caBundle of its CA (--own-webhook-configuration), by patching it by name.
It cannot create webhook configurations at all.
*/ -}}
{{- define "gemp.seedWebhookConfiguration" -}}
{{- $controller := include "gemp.controllerUsername" . -}}
{{- $preserveKeys := include "gemp.preserveRelatedAnnotations" . | fromJsonArray -}}
{{- $namespaces := dict "matchLabels" (dict "extensions.gardener.cloud/machine-preservation" "true") -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ include "gemp.configuration.name" . }}
  labels:
    {{- include "gemp.labels" . | nindent 4 }}
webhooks:
  - name: preserve-annotation.machines.machine-preservation.sapcloud.io
    clientConfig:
      service:
        namespace: {{ .Release.Namespace }}
        name: {{ include "gemp.webhook.name" . }}
        # The listener of the seed's webhooks, apart from the one every shoot's kube-apiserver calls.
        port: {{ include "gemp.webhook.seedServicePort" . }}
        path: /validate-preserve-annotation
    rules:
      - apiGroups: [machine.sapcloud.io]
        apiVersions: [v1alpha1]
        operations: [CREATE, UPDATE]
        resources: [machines]
        scope: Namespaced
    matchConditions:
      - name: preserve-annotations-change
        expression: {{ include "gemp.cel.anyAnnotationChanged" $preserveKeys | toJson }}
      - name: not-the-controller
        expression: {{ printf "!(request.userInfo.username in [%s])" (include "gemp.cel.string" $controller) | toJson }}
      # Never a Worker restore: after a control-plane migration the provider extension (a ServiceAccount in an
      # extension-* namespace of the seed) re-creates the shoot's Machines with their annotations, ours included;
      # neither a denial nor an outage of ours may stall the migration.
      - name: not-a-restore
        expression: {{ "!(request.operation == 'CREATE' && request.userInfo.username.startsWith('system:serviceaccount:extension-'))" | toJson }}
    failurePolicy: Fail
    matchPolicy: Equivalent
    sideEffects: None
    timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
    admissionReviewVersions: [v1]
    namespaceSelector:
      {{- toYaml $namespaces | nindent 6 }}
  - name: deletion.machines.machine-preservation.sapcloud.io
    clientConfig:
      service:
        namespace: {{ .Release.Namespace }}
        name: {{ include "gemp.webhook.name" . }}
        # The listener of the seed's webhooks, apart from the one every shoot's kube-apiserver calls.
        port: {{ include "gemp.webhook.seedServicePort" . }}
        path: /validate-machine-deletion
    rules:
      - apiGroups: [machine.sapcloud.io]
        apiVersions: [v1alpha1]
        operations: [DELETE]
        resources: [machines]
        scope: Namespaced
    matchConditions:
      # Only MCM's own deletes can be denied (MCM runs in each shoot namespace as the ServiceAccount
      # machine-controller-manager), so nobody else's delete waits for the webhook: not the provider extension's
      # force-deletions, not gardenlet's.
      - name: deleted-by-mcm
        expression: {{ "request.userInfo.username.startsWith('system:serviceaccount:shoot--') && request.userInfo.username.endsWith(':machine-controller-manager')" | toJson }}
      # Only Failed machines and machines carrying our preservation record (in any phase: MCM deletes the
      # Machine of a deleted Node) are ever kept, so an outage never blocks MCM deleting the others.
      - name: machine-failed-or-preserved
        expression: {{ include "gemp.cel.failedOrPreserved" "oldObject" | toJson }}
      # Never a machine Gardener marked for forced deletion: it marks every machine of a Shoot it hibernates or
      # deletes before MCM deletes them, so an outage of ours never blocks hibernation or shoot deletion.
      - name: not-force-deletion
        expression: {{ include "gemp.cel.notForceDeleted" "oldObject" | toJson }}
    failurePolicy: Fail
    matchPolicy: Equivalent
    sideEffects: None
    timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
    admissionReviewVersions: [v1]
    namespaceSelector:
      {{- toYaml $namespaces | nindent 6 }}
{{- end -}}
