{{/*
The objects' name: the release's when it names the chart (`helm install
context-assembler ...` gives the names deploy/k8s uses), else release-chart.
*/}}
{{- define "context-assembler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The worker's labels; app.kubernetes.io/name is what the selectors match. */}}
{{- define "context-assembler.labels" -}}
app.kubernetes.io/name: {{ include "context-assembler.fullname" . }}
app.kubernetes.io/component: worker
app.kubernetes.io/part-of: context-assembler
{{- end -}}

{{/*
The generated ConfigMaps' names, each with a hash of its content as kustomize's
configMapGenerator makes them: an edit renames the ConfigMap, which changes the
pod template and so rolls the workers.
*/}}
{{- define "context-assembler.policyConfigMap" -}}
{{- printf "%s-policy-%s" (include "context-assembler.fullname" .) (.Values.policy | sha256sum | trunc 10) -}}
{{- end -}}

{{- define "context-assembler.settingsConfigMap" -}}
{{- printf "%s-settings-%s" (include "context-assembler.fullname" .) (include "context-assembler.settings" . | sha256sum | trunc 10) -}}
{{- end -}}

{{/* The settings as ConfigMap data: every value a string, a null one left out. */}}
{{- define "context-assembler.settings" -}}
{{- range $name, $value := .Values.settings }}
{{- if not (kindIs "invalid" $value) }}
{{ $name }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "context-assembler.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | toString) -}}
{{- end -}}

{{- define "context-assembler.kafkaSecret" -}}
{{- printf "%s-kafka" (include "context-assembler.fullname" .) -}}
{{- end -}}

{{/*
The Secret volume of the Kafka credentials, optional: without the Secret the
directory is empty and the worker connects as the settings say (PLAINTEXT by
default).
*/}}
{{- define "context-assembler.kafkaCredentialsVolume" -}}
- name: kafka-credentials
  secret:
    secretName: {{ include "context-assembler.kafkaSecret" . }}
    optional: true
    defaultMode: 0440
{{- end -}}

{{/*
The worker's pod, the same for both workloads but for its guarantee and, under
exactly_once, its static membership id (the pod's stable name).
*/}}
{{- define "context-assembler.podTemplate" -}}
metadata:
  labels:
    {{- include "context-assembler.labels" . | nindent 4 }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: "8080"
    prometheus.io/path: /metrics
spec:
  # SIGTERM to SIGKILL: the worker exits within ASSEMBLER_SHUTDOWN_GRACE_SECONDS
  # (20 s by default); keep that setting below this value.
  terminationGracePeriodSeconds: 30
  {{- with .Values.serviceAccountName }}
  serviceAccountName: {{ . }}
  {{- end }}
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  # Prefer replicas on different zones and nodes.
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          app.kubernetes.io/name: {{ include "context-assembler.fullname" . }}
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          app.kubernetes.io/name: {{ include "context-assembler.fullname" . }}
  containers:
    - name: worker
      image: {{ include "context-assembler.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["worker"]
      ports:
        - name: http
          containerPort: 8080
          protocol: TCP
      envFrom:
        - configMapRef:
            name: {{ include "context-assembler.settingsConfigMap" . }}
      env:
        - name: ASSEMBLER_POLICY_FILE
          value: /etc/context-assembler/policy.toml
        - name: ASSEMBLER_PROCESSING_GUARANTEE
          value: {{ .Values.guarantee }}
        {{- if eq .Values.guarantee "exactly_once" }}
        # Static membership (KIP-345): a replica restarted within the session
        # timeout gets its partitions back without a group-wide rebalance.
        - name: ASSEMBLER_GROUP_INSTANCE_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        - name: ASSEMBLER_HTTP_HOST
          value: 0.0.0.0  # probes and scrapes come from outside the pod
        - name: ASSEMBLER_HTTP_PORT
          value: "8080"
      startupProbe:
        httpGet:
          path: /health
          port: http
        periodSeconds: 2
        failureThreshold: 30
      livenessProbe:
        httpGet:
          path: /health
          port: http
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /ready
          port: http
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 3
      # Measured: about one core and 150-250 MB resident when busy; the memory
      # limit is above bench.memory_bench's 400 MB ceiling; no CPU limit (its
      # throttling would stall heartbeats and commits in a burst).
      resources:
        requests:
          cpu: "1"
          memory: 256Mi
        limits:
          memory: 512Mi
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: policy
          mountPath: /etc/context-assembler
          readOnly: true
        - name: workdir
          mountPath: /app
        - name: tmp
          mountPath: /tmp
        - name: kafka-credentials
          mountPath: /etc/context-assembler/kafka
          readOnly: true
  volumes:
    - name: policy
      configMap:
        name: {{ include "context-assembler.policyConfigMap" . }}
        items:
          - key: policy.toml
            path: policy.toml
    # The root filesystem is read-only: these are the only writable places.
    - name: workdir
      emptyDir:
        sizeLimit: 256Mi
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- include "context-assembler.kafkaCredentialsVolume" . | nindent 4 }}
{{- end -}}
