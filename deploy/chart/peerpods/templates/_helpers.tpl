{{- define "peerpods.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "peerpods.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Object name of a component: (dict "ctx" $ "component" "provider-service") */}}
{{- define "peerpods.componentName" -}}
{{- printf "%s-%s" (include "peerpods.fullname" .ctx) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "peerpods.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: {{ include "peerpods.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels selecting one component's Pods: (dict "ctx" $ "component" "provider-service") */}}
{{- define "peerpods.selectorLabels" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{- define "peerpods.componentLabels" -}}
{{ include "peerpods.labels" .ctx }}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* ServiceAccount name: (dict "ctx" $ "component" "provider-service" "values" .Values.providerService) */}}
{{- define "peerpods.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (include "peerpods.componentName" .) .values.serviceAccount.name -}}
{{- else -}}
{{- required (printf "%s.serviceAccount.name is required when serviceAccount.create is false" .component) .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "peerpods.image" -}}
{{- $repo := .values.image.repository | default (printf "%s/%s" .ctx.Values.image.repositoryPrefix .component) -}}
{{- $tag := .values.image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- define "peerpods.providerServiceName" -}}
{{- include "peerpods.componentName" (dict "ctx" . "component" "provider-service") -}}
{{- end -}}

{{- define "peerpods.tlsSecretName" -}}
{{- printf "%s-tls" (include "peerpods.providerServiceName" .) -}}
{{- end -}}

{{/* provider-service's own namespace (providerService.namespace): it, its credential and its TLS key live there,
     apart from the privileged CAA DaemonSet and from what peer-pod-config-ctrl creates in the release namespace. */}}
{{- define "peerpods.providerServiceNamespace" -}}
{{- .Values.providerService.namespace.name | default (printf "%s-provider" .Release.Namespace | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{/* cloud-api-adaptor's namespace and ConfigMap, where peerpod-ctrl reads PODVM_DEVELOPER_MODE
     (peerpodCtrl.developerMode): by default the release namespace and peerpodsConfig.configMapName. */}}
{{- define "peerpods.caaConfigNamespace" -}}
{{- .Values.peerpodCtrl.developerMode.namespace | default .Release.Namespace -}}
{{- end -}}
{{- define "peerpods.caaConfigMapName" -}}
{{- .Values.peerpodCtrl.developerMode.configMapName | default .Values.peerpodsConfig.configMapName -}}
{{- end -}}

{{/* The uninstall protection (uninstall-protection.yaml): its policy, its binding and the ConfigMap where
     peerpod-ctrl publishes how many PeerPods hold peer.pod/finalizer share this name. */}}
{{- define "peerpods.inUseName" -}}
{{- printf "%s-provider-service-in-use" (include "peerpods.fullname" .) -}}
{{- end -}}

{{/* The CA of provider-service's certificate (ca.crt only, no key), published in the release namespace for the
     callers there: a Pod mounts only Secrets of its own namespace. */}}
{{- define "peerpods.providerCASecretName" -}}
{{- printf "%s-ca" (include "peerpods.tlsSecretName" .) -}}
{{- end -}}

{{/* The DNS name controllers dial; provider-service's certificate carries it. */}}
{{- define "peerpods.providerServiceHost" -}}
{{- printf "%s.%s.svc" (include "peerpods.providerServiceName" .) (include "peerpods.providerServiceNamespace" .) -}}
{{- end -}}

{{- define "peerpods.providerEndpoint" -}}
{{- printf "https://%s:%v" (include "peerpods.providerServiceHost" .) .Values.providerService.grpcPort -}}
{{- end -}}

{{/* Common container pieces of the controllers: how they reach provider-service. */}}
{{- define "peerpods.providerClientEnv" -}}
- name: PROVIDER_ENDPOINT
  value: {{ include "peerpods.providerEndpoint" . | quote }}
- name: PROVIDER_AUTH
  value: token
- name: PROVIDER_CA
  value: /var/run/secrets/provider-service/ca.crt
- name: TOKEN_FILE
  value: /var/run/secrets/provider-service/token
{{- end -}}

{{/* Projected volume: a token for provider-service's audience and the CA of its certificate (not its key). */}}
{{- define "peerpods.providerClientVolume" -}}
- name: provider-service
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ .Values.providerService.audience | quote }}
          expirationSeconds: 3600
          path: token
      - secret:
          name: {{ include "peerpods.providerCASecretName" . }}
          items:
            - key: ca.crt
              path: ca.crt
{{- end -}}

{{- define "peerpods.downwardEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* The secure metrics port (metrics.secure): a container port and the flags that serve it. */}}
{{- define "peerpods.metricsPort" -}}
{{- if .Values.metrics.secure }}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
{{- end }}
{{- end -}}
{{- define "peerpods.metricsEnv" -}}
- name: METRICS_SECURE
  value: {{ .Values.metrics.secure | quote }}
{{- if .Values.metrics.secure }}
- name: METRICS_LISTEN
  value: "0.0.0.0:{{ .Values.metrics.port }}"
{{- end }}
{{- end -}}

{{/* Liveness and readiness on the admin port. */}}
{{- define "peerpods.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{/* Spread replicas over nodes when possible: (dict "ctx" $ "component" "...") */}}
{{- define "peerpods.defaultAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "peerpods.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/*
Where a component's pods run: node selector, tolerations, affinity (a soft anti-affinity by default),
topology spread constraints and priority class, from the component's values. Takes the component dict.
*/}}
{{- define "peerpods.podScheduling" -}}
{{- $v := .values -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- if $v.affinity }}
  {{- toYaml $v.affinity | nindent 2 }}
  {{- else }}
  {{- include "peerpods.defaultAffinity" . | nindent 2 }}
  {{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* How long provider-service answers a DeleteInstance within at most (DELETE_ANSWER_WITHIN, seconds): a controller's
     reconcile waits that long for its answer, so the controllers' grace periods cover it. */}}
{{- define "peerpods.deleteAnswerWithinSeconds" -}}20{{- end -}}
