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

{{- define "tool-retry-sidecar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The sidecar container. Include it in your own pod spec under initContainers (native
sidecar, Kubernetes >= 1.29) or containers; see the README's "Deploy" section.
*/}}
{{- define "tool-retry-sidecar.container" -}}
- name: tool-retry-sidecar
  image: {{ include "tool-retry-sidecar.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  ports:
    - {name: proxy, containerPort: {{ .Values.sidecar.port }}, protocol: TCP}
    - {name: admin, containerPort: {{ .Values.sidecar.adminPort }}, protocol: TCP}
  env:
    - {name: SIDECAR_PORT, value: {{ .Values.sidecar.port | quote }}}
    - {name: SIDECAR_ADMIN_PORT, value: {{ .Values.sidecar.adminPort | quote }}}
    - {name: SIDECAR_DRAIN_TIMEOUT_MS, value: {{ mul .Values.sidecar.drainTimeoutSeconds 1000 | quote }}}
    {{- with .Values.sidecar.upstreamUrl }}
    - {name: SIDECAR_UPSTREAM_URL, value: {{ . | quote }}}
    {{- end }}
    {{- if .Values.sidecar.routes }}
    - {name: SIDECAR_CONFIG_FILE, value: /etc/tool-retry-sidecar/routes.yaml}
    {{- end }}
    {{- range $name, $value := .Values.sidecar.settings }}
    - {name: {{ printf "SIDECAR_%s" (upper $name) }}, value: {{ $value | quote }}}
    {{- end }}
    {{- with .Values.sidecar.llm.baseUrl }}
    - {name: SIDECAR_LLM_BASE_URL, value: {{ . | quote }}}
    {{- end }}
    - {name: SIDECAR_LLM_MODEL, value: {{ .Values.sidecar.llm.model | quote }}}
    {{- with .Values.sidecar.llm.apiKeySecret.name }}
    - name: SIDECAR_LLM_API_KEY
      valueFrom:
        secretKeyRef: {name: {{ . | quote }}, key: {{ $.Values.sidecar.llm.apiKeySecret.key | quote }}}
    {{- end }}
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 1
    failureThreshold: 30
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
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
  {{- if .Values.sidecar.routes }}
  volumeMounts:
    - {name: tool-retry-sidecar-config, mountPath: /etc/tool-retry-sidecar, readOnly: true}
  {{- end }}
{{- end -}}
