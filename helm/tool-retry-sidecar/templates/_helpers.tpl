{{- define "tool-retry-sidecar.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tool-retry-sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tool-retry-sidecar.labels" -}}
app.kubernetes.io/name: {{ include "tool-retry-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tool-retry-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tool-retry-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The pods that carry the sidecar: see metrics.podSelector in values.yaml. */}}
{{- define "tool-retry-sidecar.podSelector" -}}
{{- if .Values.metrics.podSelector -}}
{{- toYaml .Values.metrics.podSelector -}}
{{- else if .Values.example.enabled -}}
{{- include "tool-retry-sidecar.selectorLabels" . -}}
{{- else -}}
tool-retry-sidecar/injected: "true"
{{- end -}}
{{- end -}}

{{- define "tool-retry-sidecar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tool-retry-sidecar.configMapName" -}}
{{ include "tool-retry-sidecar.fullname" . }}-config
{{- end -}}

{{/* The LLM key's Secret: the one named, or the one this chart creates. */}}
{{- define "tool-retry-sidecar.llmSecretName" -}}
{{- with .Values.sidecar.llm.apiKeySecret -}}
{{- if .name -}}
{{ .name }}
{{- else if .create -}}
{{ include "tool-retry-sidecar.fullname" $ }}-llm
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The sidecar's config file: everything but the secret and the listen addresses. */}}
{{- define "tool-retry-sidecar.configFile" -}}
{{- $config := deepCopy .Values.sidecar.settings -}}
{{- with .Values.sidecar.upstreamUrl }}{{ $_ := set $config "upstream_url" . }}{{ end -}}
{{- with .Values.sidecar.routes }}{{ $_ := set $config "routes" . }}{{ end -}}
{{- with .Values.sidecar.llm.baseUrl }}{{ $_ := set $config "llm_base_url" . }}{{ end -}}
{{- with .Values.sidecar.llm.model }}{{ $_ := set $config "llm_model" . }}{{ end -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
Seconds the pod gets to stop: the sidecar's drain, the plain-container preStop pause, and
ten more for the agent to exit and the kubelet to reap.
*/}}
{{- define "tool-retry-sidecar.gracePeriodSeconds" -}}
{{- $pause := ternary 0 (int .Values.sidecar.preStopSleepSeconds) .Values.sidecar.native -}}
{{- add (int .Values.sidecar.drainTimeoutSeconds) $pause 10 -}}
{{- end -}}

{{/* Native sidecars need Kubernetes >= 1.29: say so instead of rendering a pod that fails. */}}
{{- define "tool-retry-sidecar.requireNativeSidecars" -}}
{{- if and .Values.sidecar.native (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "sidecar.native=true needs Kubernetes >= 1.29 (native sidecars); this cluster is %s: set sidecar.native=false for a plain sidecar container" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/* The sidecar container of the example pod. Your own pods get it from `inject`. */}}
{{- define "tool-retry-sidecar.container" -}}
- name: tool-retry-sidecar
  image: {{ include "tool-retry-sidecar.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  ports:
    - {name: sidecar-proxy, containerPort: {{ .Values.sidecar.port }}, protocol: TCP}
    - {name: sidecar-admin, containerPort: {{ .Values.sidecar.adminPort }}, protocol: TCP}
  env:
    - {name: SIDECAR_HOST, value: {{ .Values.sidecar.host | quote }}}
    - {name: SIDECAR_PORT, value: {{ .Values.sidecar.port | quote }}}
    # Probes and Prometheus reach the admin port on the pod IP.
    - {name: SIDECAR_ADMIN_HOST, value: "0.0.0.0"}
    - {name: SIDECAR_ADMIN_PORT, value: {{ .Values.sidecar.adminPort | quote }}}
    - {name: SIDECAR_DRAIN_TIMEOUT_MS, value: {{ mul .Values.sidecar.drainTimeoutSeconds 1000 | quote }}}
    - {name: SIDECAR_CONFIG_FILE, value: /etc/tool-retry-sidecar/sidecar.yaml}
    {{- with include "tool-retry-sidecar.llmSecretName" . }}
    - name: SIDECAR_LLM_API_KEY
      valueFrom:
        secretKeyRef: {name: {{ . | quote }}, key: {{ $.Values.sidecar.llm.apiKeySecret.key | quote }}}
    {{- end }}
    {{- with .Values.sidecar.state }}
    {{- if .urlSecret.name }}
    - name: SIDECAR_STATE_URL
      valueFrom:
        secretKeyRef: {name: {{ .urlSecret.name | quote }}, key: {{ .urlSecret.key | quote }}}
    - {name: SIDECAR_STATE_PREFIX, value: {{ .prefix | quote }}}
    - {name: SIDECAR_STATE_TIMEOUT_MS, value: {{ .timeoutMs | quote }}}
    {{- end }}
    {{- end }}
    {{- with .Values.sidecar.tracing }}
    {{- if .otlpEndpoint }}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ .otlpEndpoint | quote }}}
    - {name: OTEL_SERVICE_NAME, value: {{ .serviceName | quote }}}
    - {name: OTEL_TRACES_SAMPLER, value: {{ .sampler | quote }}}
    {{- if .samplerArg }}
    - {name: OTEL_TRACES_SAMPLER_ARG, value: {{ .samplerArg | quote }}}
    {{- end }}
    - name: OTEL_RESOURCE_ATTRIBUTES
      value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE){{ with .resourceAttributes }},{{ . }}{{ end }}"
    {{- end }}
    {{- end }}
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    httpGet: {path: /readyz, port: sidecar-admin}
    periodSeconds: 1
    failureThreshold: 30
  readinessProbe:
    httpGet: {path: /readyz, port: sidecar-admin}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /healthz, port: sidecar-admin}
    periodSeconds: 10
    failureThreshold: 3
  {{- if not .Values.sidecar.native }}
  lifecycle:
    preStop:
      exec:
        command: [sleep, {{ .Values.sidecar.preStopSleepSeconds | quote }}]
  {{- end }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - {name: tool-retry-sidecar-config, mountPath: /etc/tool-retry-sidecar, readOnly: true}
{{- end -}}
