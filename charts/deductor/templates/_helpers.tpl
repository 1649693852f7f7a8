{{/*
Names, labels and the rendering of config.toml.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "deductor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every resource: fullnameOverride, or <release>-<name> (just
<release> when it already contains the name). At most 52 characters, so that
a StatefulSet pod name with its controller-revision-hash label stays within 63.
*/}}
{{- define "deductor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "deductor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select the pods: never change them after the first install. */}}
{{- define "deductor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deductor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every resource. */}}
{{- define "deductor.labels" -}}
helm.sh/chart: {{ include "deductor.chart" . }}
{{ include "deductor.selectorLabels" . }}
app.kubernetes.io/version: {{ include "deductor.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: consumer
app.kubernetes.io/part-of: {{ .Values.partOf }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "deductor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "deductor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "deductor.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "deductor.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "deductor.imageTag" .) }}
{{- end }}
{{- end }}

{{/* The Secret holding the passwords, or "" when there is none. */}}
{{- define "deductor.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if or .Values.secret.redisPassword .Values.secret.kafkaSaslPassword .Values.secret.sentinelPassword }}
{{- include "deductor.fullname" . }}
{{- end }}
{{- end }}

{{/* config.pipeline.drain_timeout_secs, or the service's default (20). */}}
{{- define "deductor.drainTimeout" -}}
{{- $pipeline := default dict .Values.config.pipeline }}
{{- if hasKey $pipeline "drain_timeout_secs" }}
{{- int64 $pipeline.drain_timeout_secs }}
{{- else }}
{{- 20 }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: above the drain timeout, so that Kubernetes
never SIGKILLs a pod that is still draining (which would be safe, since
nothing is committed before it is done, but replays work and rebalances late).
*/}}
{{- define "deductor.terminationGracePeriod" -}}
{{- $drain := include "deductor.drainTimeout" . | int64 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $drain .Values.terminationGraceMarginSeconds }}
{{- else }}
{{- $grace := int64 .Values.terminationGracePeriodSeconds }}
{{- if lt $grace (add $drain 5 | int64) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least config.pipeline.drain_timeout_secs + 5 (%d): the pod needs the drain timeout plus time to commit and leave the group; raise it, or set it to null to derive it" $grace (add $drain 5)) }}
{{- end }}
{{- $grace }}
{{- end }}
{{- end }}

{{/* Refuse replica counts the input topic cannot feed. */}}
{{- define "deductor.validate" -}}
{{- $partitions := int64 .Values.kafka.inputPartitions }}
{{- $keda := .Values.autoscaling.keda }}
{{- if $keda.enabled }}
{{- if gt (int64 $keda.maxReplicaCount) $partitions }}
{{- fail (printf "autoscaling.keda.maxReplicaCount (%d) is above kafka.inputPartitions (%d): a consumer beyond the partition count gets no partition and stays unready; lower maxReplicaCount or add partitions to the input topic first" (int64 $keda.maxReplicaCount) $partitions) }}
{{- end }}
{{- if gt (int64 $keda.minReplicaCount) (int64 $keda.maxReplicaCount) }}
{{- fail (printf "autoscaling.keda.minReplicaCount (%d) is above maxReplicaCount (%d)" (int64 $keda.minReplicaCount) (int64 $keda.maxReplicaCount)) }}
{{- end }}
{{- else if gt (int64 .Values.replicaCount) $partitions }}
{{- fail (printf "replicaCount (%d) is above kafka.inputPartitions (%d): a consumer beyond the partition count gets no partition and stays unready; lower replicaCount or add partitions to the input topic first" (int64 .Values.replicaCount) $partitions) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled: the ServiceMonitor scrapes the metrics Service" }}
{{- end }}
{{- end }}

{{/*
config.toml from .Values.config, plus the keys the chart owns (http.listen:
every interface here; with httpListen podIP/podIPv6, DEDUCTOR_HTTP_LISTEN
overrides it with the pod's address).
Values arrive from YAML as float64, so integral numbers are printed as
integers; librdkafka properties are always strings.
*/}}
{{- define "deductor.configToml" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- $http := default dict $cfg.http }}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int64 .Values.httpPort)) }}
{{- $_ := set $cfg "http" $http }}
{{- $sentinel := (default dict (default dict .Values.redis).sentinel) }}
{{- $redis := default dict $cfg.redis }}
{{- $_ := set $redis "url" (include "deductor.redisUrl" .) }}
{{- if $sentinel.enabled }}
{{- with $sentinel.username }}
{{- $_ := set $redis "sentinel_username" . }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "redis" $redis }}
# Rendered by the deductor Helm chart from .Values.config; keys as in
# config/default.toml. Secrets come from the environment, never from here.
{{- range $section := keys $cfg | sortAlpha }}
{{- $table := get $cfg $section }}
{{ include "deductor.tomlTable" (dict "path" (list $section) "table" $table) }}
{{- end }}
{{- end }}

{{/*
config.redis.url as rendered: redis.sentinel writes it when enabled. A
password in the url is refused: it would land in the ConfigMap.
*/}}
{{- define "deductor.redisUrl" -}}
{{- $sentinel := (default dict (default dict .Values.redis).sentinel) }}
{{- $url := (default dict .Values.config.redis).url | default "redis://127.0.0.1:6379" }}
{{- if $sentinel.enabled }}
{{- if not $sentinel.hosts }}
{{- fail "redis.sentinel.enabled needs redis.sentinel.hosts: the sentinels' host:port, e.g. [\"redis.redis.svc:26379\"]" }}
{{- end }}
{{- $scheme := ternary "rediss-sentinel" "redis-sentinel" (default false $sentinel.tls) }}
{{- $url = printf "%s://%s/%s" $scheme (join "," $sentinel.hosts) (default "mymaster" $sentinel.masterSet) }}
{{- end }}
{{- if regexMatch "^[A-Za-z0-9+.-]+://[^:@/?]*:.+@" $url }}
{{- fail "config.redis.url (or redis.sentinel.hosts) holds a password (user:password@): it would land in the ConfigMap; leave only redis://[user@]host:port there and put the password in secret.redisPassword or secret.existingSecret (and config.redis.username for the user)" }}
{{- end }}
{{- $url }}
{{- end }}

{{/* "true" when Redis is reached through Sentinel, else "". */}}
{{- define "deductor.sentinelOn" -}}
{{- if regexMatch "^rediss?-sentinel://" (include "deductor.redisUrl" .) }}true{{ end }}
{{- end }}

{{/*
"true" when a Kafka client authenticates with SASL (security.protocol
SASL_PLAINTEXT or SASL_SSL, or a sasl.mechanism set), else "".
*/}}
{{- define "deductor.kafkaSasl" -}}
{{- $kafka := default dict .Values.config.kafka }}
{{- range $client := list "consumer" "producer" }}
{{- $props := default dict (get $kafka $client) }}
{{- if or (hasPrefix "sasl_" (lower (toString (get $props "security.protocol")))) (hasKey $props "sasl.mechanism") (hasKey $props "sasl.mechanisms") }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The TCP ports the rendered config names, as YAML lists: kafka (every
bootstrap server, 9092 when left out), redis (the url's hosts, sentinels
(26379 when left out) and Cluster seed nodes (6379)), otlp (the tracing
endpoint's port, 80/443 when left out; empty when not exporting).
*/}}
{{- define "deductor.configPorts" -}}
{{- $kafka := list }}
{{- range $b := splitList "," ((default dict .Values.config.kafka).brokers | default "127.0.0.1:9092") }}
{{- $b = regexReplaceAll "^[A-Za-z_]+://" (trimAll " " $b) "" }}
{{- if $b }}
{{- $m := regexFind ":[0-9]+$" $b }}
{{- $kafka = append $kafka (ternary (trimPrefix ":" $m | int) 9092 (ne $m "")) }}
{{- end }}
{{- end }}
{{- $url := include "deductor.redisUrl" . }}
{{- $sentinel := regexMatch "^rediss?-sentinel://" $url }}
{{- $rest := regexReplaceAll "^[^:]+://" $url "" }}
{{- $hosts := regexReplaceAll "[/?].*$" (regexReplaceAll "^.*@" (regexReplaceAll "[?].*$" $rest "") "") "" }}
{{- $nodes := splitList "," $hosts }}
{{- range regexFindAll "node=[^&]+" $url -1 }}
{{- $nodes = append $nodes (trimPrefix "node=" .) }}
{{- end }}
{{- $redis := list }}
{{- range $nodes }}
{{- if . }}
{{- $m := regexFind ":[0-9]+$" . }}
{{- $redis = append $redis (ternary (trimPrefix ":" $m | int) (ternary 26379 6379 $sentinel) (ne $m "")) }}
{{- end }}
{{- end }}
{{- $otlp := list }}
{{- with (default dict .Values.config.tracing).otlp_endpoint }}
{{- $authority := regexReplaceAll "/.*$" (regexReplaceAll "^[^:]+://" . "") "" }}
{{- $m := regexFind ":[0-9]+$" $authority }}
{{- $otlp = append $otlp (ternary (trimPrefix ":" $m | int) (ternary 443 80 (hasPrefix "https://" .)) (ne $m "")) }}
{{- end }}
kafka: {{ $kafka | uniq | toJson }}
redis: {{ $redis | uniq | toJson }}
otlp: {{ $otlp | toJson }}
{{- end }}

{{/* One TOML table: its scalar keys, then its sub-tables. */}}
{{- define "deductor.tomlTable" -}}
{{- $path := .path }}
{{- $stringsOnly := and (eq (len $path) 2) (eq (index $path 0) "kafka") }}
{{- $header := list }}
{{- range $path }}{{ $header = append $header (toJson .) }}{{ end }}
[{{ join "." $header }}]
{{- range $k := keys .table | sortAlpha }}
{{- $v := get $.table $k }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ toJson $k }} = {{ if $stringsOnly }}{{ include "deductor.tomlString" $v }}{{ else }}{{ include "deductor.tomlValue" $v }}{{ end }}
{{- end }}
{{- end }}
{{- range $k := keys .table | sortAlpha }}
{{- $v := get $.table $k }}
{{- if kindIs "map" $v }}
{{ include "deductor.tomlTable" (dict "path" (append $path $k) "table" $v) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "deductor.tomlValue" -}}
{{- if kindIs "string" . }}
{{- toJson . }}
{{- else if kindIs "bool" . }}
{{- . }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) }}
{{- if eq (floor .) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "deductor.tomlValue" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* A librdkafka property: always a TOML string. */}}
{{- define "deductor.tomlString" -}}
{{- if or (kindIs "float64" .) (kindIs "float32" .) }}
{{- if eq (floor .) (float64 .) }}{{ int64 . | toString | toJson }}{{ else }}{{ toString . | toJson }}{{ end }}
{{- else }}
{{- toString . | toJson }}
{{- end }}
{{- end }}

{{/* The pod's environment: config file, static membership, secrets, extras. */}}
{{- define "deductor.env" -}}
- name: DEDUCTOR_CONFIG
  value: /etc/deductor/config.toml
{{- if ne .Values.httpListen "all" }}
# The HTTP endpoints on the pod's own address (httpListen), not 0.0.0.0.
- name: DEDUCTOR_POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: DEDUCTOR_HTTP_LISTEN
  value: {{ printf (ternary "[$(DEDUCTOR_POD_IP)]:%d" "$(DEDUCTOR_POD_IP):%d" (eq .Values.httpListen "podIPv6")) (int64 .Values.httpPort) | quote }}
{{- end }}
{{- $kafka := default dict .Values.config.kafka }}
{{- if eq (toString $kafka.delivery) "exactly_once" }}
{{- $keda := .Values.autoscaling.keda }}
{{- $pods := ternary (int64 $keda.maxReplicaCount) (int64 .Values.replicaCount) $keda.enabled }}
{{- if and $kafka.transactional_id (gt $pods 1) }}
{{- fail (printf "config.kafka.transactional_id (%s) would be shared by up to %d pods: in exactly_once each registration fences the other pods' producers, for ever; leave it empty, and the chart gives each pod its own id, <group_id>-<pod name>" $kafka.transactional_id $pods) }}
{{- end }}
{{- if not $kafka.transactional_id }}
# exactly_once: a transactional.id per pod, stable across container restarts
# (a restarted container aborts its predecessor's open transaction at once).
- name: DEDUCTOR_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: DEDUCTOR_KAFKA_TRANSACTIONAL_ID
  value: {{ printf "%s-$(DEDUCTOR_POD_NAME)" (default "deductor" $kafka.group_id) | quote }}
{{- end }}
{{- end }}
{{- if .Values.staticMembership.enabled }}
- name: DEDUCTOR_KAFKA_GROUP_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- $secret := include "deductor.secretName" . }}
{{- if $secret }}
{{- $existing := .Values.secret.existingSecret }}
{{- $keys := include "deductor.secretKeys" . | fromYaml }}
{{- if .Values.secret.mountAsFiles }}
{{- with $keys.redisPassword }}
- name: DEDUCTOR_REDIS_PASSWORD_FILE
  value: {{ printf "%s/%s" (include "deductor.secretDir" $) . }}
{{- end }}
{{- with $keys.kafkaSaslPassword }}
- name: DEDUCTOR_KAFKA_SASL_PASSWORD_FILE
  value: {{ printf "%s/%s" (include "deductor.secretDir" $) . }}
{{- end }}
{{- with $keys.sentinelPassword }}
- name: DEDUCTOR_REDIS_SENTINEL_PASSWORD_FILE
  value: {{ printf "%s/%s" (include "deductor.secretDir" $) . }}
{{- end }}
{{- else }}
{{- with $keys.redisPassword }}
- name: DEDUCTOR_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ . }}
      optional: {{ ternary "true" "false" (not (empty $existing)) }}
{{- end }}
{{- with $keys.sentinelPassword }}
- name: DEDUCTOR_REDIS_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ . }}
      optional: {{ ternary "true" "false" (not (empty $existing)) }}
{{- end }}
{{- with $keys.kafkaSaslPassword }}
{{- $key := . }}
{{- range $client := list "CONSUMER" "PRODUCER" }}
- name: DEDUCTOR_KAFKA_{{ $client }}_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: {{ ternary "true" "false" (not (empty $existing)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The Secret's keys the pods use, as YAML (redisPassword, kafkaSaslPassword,
sentinelPassword: the key names). Only the keys the config needs: the
sentinels' password only with Sentinel, the Kafka SASL password only when
a Kafka client uses SASL (or the chart's Secret holds one). Of an existing
Secret, every such key whose name is not empty; of the chart's Secret, the
keys that have a value.
*/}}
{{- define "deductor.secretKeys" -}}
{{- $s := .Values.secret }}
{{- $sentinel := include "deductor.sentinelOn" . }}
{{- if and $s.sentinelPassword (not $sentinel) }}
{{- fail "secret.sentinelPassword is set, but Redis is not reached through Sentinel (redis.sentinel.enabled, or a redis-sentinel:// config.redis.url): the service refuses sentinel credentials without Sentinel; leave it empty" }}
{{- end }}
{{- if and (or $s.existingSecret $s.redisPassword) $s.keys.redisPassword }}
redisPassword: {{ $s.keys.redisPassword | quote }}
{{- end }}
{{- if and (or $s.kafkaSaslPassword (and $s.existingSecret (include "deductor.kafkaSasl" .))) $s.keys.kafkaSaslPassword }}
kafkaSaslPassword: {{ $s.keys.kafkaSaslPassword | quote }}
{{- end }}
{{- if and $sentinel (or $s.existingSecret $s.sentinelPassword) $s.keys.sentinelPassword }}
sentinelPassword: {{ $s.keys.sentinelPassword | quote }}
{{- end }}
{{- end }}

{{/* Where secret.mountAsFiles mounts the Secret. */}}
{{- define "deductor.secretDir" -}}
/etc/deductor-secrets
{{- end }}

{{/* The pod's volumes: config, /tmp, secrets as files, extras (the workload and the test pod). */}}
{{- define "deductor.volumes" -}}
- name: config
  configMap:
    name: {{ include "deductor.fullname" . }}
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- $secret := include "deductor.secretName" . }}
{{- $keys := include "deductor.secretKeys" . | fromYaml }}
{{- if and .Values.secret.mountAsFiles $secret $keys }}
- name: secrets
  secret:
    secretName: {{ $secret }}
    defaultMode: 0440
    items:
      {{- range $k := values $keys | sortAlpha }}
      - key: {{ $k }}
        path: {{ $k }}
      {{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The container's volume mounts, matching deductor.volumes. */}}
{{- define "deductor.volumeMounts" -}}
- name: config
  mountPath: /etc/deductor
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if and .Values.secret.mountAsFiles (include "deductor.secretName" .) (include "deductor.secretKeys" . | fromYaml) }}
- name: secrets
  mountPath: {{ include "deductor.secretDir" . }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The peers of one NetworkPolicy rule (key "from" or "to"): its cidrs as
ipBlocks, then its peers. Nothing when both are empty: the rule then admits
any address on its ports.
*/}}
{{- define "deductor.networkPeers" -}}
{{- $peers := list }}
{{- range .rule.cidrs }}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" .)) }}
{{- end }}
{{- range .rule.peers }}
{{- $peers = append $peers . }}
{{- end }}
{{- if $peers }}
{{ .key }}:
{{- toYaml $peers | nindent 2 }}
{{- end }}
{{- end }}
