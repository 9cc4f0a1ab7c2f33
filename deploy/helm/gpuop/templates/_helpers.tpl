{{/*
Names, labels, and the parts every gpuop container shares: the `gpuop run <service>`
command line as GPUOP_* variables (libs/gpuop/runtime/settings.py), the service's NATS user,
the CA that verifies the NATS server, and the health probes.
*/}}

{{- define "gpuop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of a component: <fullname>-<component>. Call with (dict "root" $ "component" "x"). */}}
{{- define "gpuop.name" -}}
{{- printf "%s-%s" (include "gpuop.fullname" .root) .component -}}
{{- end -}}

{{- define "gpuop.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuop.labels" -}}
{{ include "gpuop.selectorLabels" . }}
app.kubernetes.io/part-of: gpuop
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gpuop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The non-root user of the image (the Dockerfile's USER). */}}
{{- define "gpuop.uid" -}}10001{{- end -}}

{{- define "gpuop.natsUsersSecret" -}}
{{- default (include "gpuop.name" (dict "root" . "component" "nats-users")) .Values.nats.auth.existingSecret -}}
{{- end -}}

{{/* The bundled NATS server's Secret: bcrypt hashes of the passwords (templates/nats/users.yaml). */}}
{{- define "gpuop.natsServerUsersSecret" -}}
{{- include "gpuop.name" (dict "root" . "component" "nats-server-users") -}}
{{- end -}}

{{/* Callout mode: the Secret of the callout's issuer key, the chart's own
(templates/nats/issuer.yaml) unless nats.auth.callout.issuerSecret names one. */}}
{{- define "gpuop.natsIssuerSecret" -}}
{{- default (include "gpuop.name" (dict "root" . "component" "nats-issuer")) .Values.nats.auth.callout.issuerSecret -}}
{{- end -}}

{{/* The issuer key's item in that Secret: key.pem (the chart's Ed25519 PEM), or seed (SA...)
in a Secret of `gpuop nats-auth --new-issuer-secret`. The callout reads either. */}}
{{- define "gpuop.natsIssuerKey" -}}
{{- if .Values.nats.auth.callout.issuerSecret }}seed{{ else }}key.pem{{ end -}}
{{- end -}}

{{/* Callout mode: the cluster roles' message-id keys (templates/nats/id-keys.yaml). */}}
{{- define "gpuop.natsIdKeysSecret" -}}
{{- include "gpuop.name" (dict "root" . "component" "nats-id-keys") -}}
{{- end -}}

{{- define "gpuop.natsTlsSecret" -}}
{{- if eq .Values.nats.tls.mode "secret" -}}
{{- required "nats.tls.secretName is required with nats.tls.mode=secret" .Values.nats.tls.secretName -}}
{{- else -}}
{{- include "gpuop.name" (dict "root" . "component" "nats-tls") -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the CA (ca.crt) that clients verify the NATS server with; empty for
an external NATS without TLS or with a publicly trusted certificate. */}}
{{- define "gpuop.natsCaSecret" -}}
{{- if .Values.nats.enabled -}}
{{- include "gpuop.natsTlsSecret" . -}}
{{- else -}}
{{- .Values.nats.external.caSecret -}}
{{- end -}}
{{- end -}}

{{/* How many servers the bundled NATS runs: one, or nats.cluster.replicas, an odd number of
at least 3 (JetStream works while a majority of its servers is up). */}}
{{- define "gpuop.natsServers" -}}
{{- if .Values.nats.cluster.enabled -}}
{{- $replicas := int .Values.nats.cluster.replicas -}}
{{- if or (lt $replicas 3) (eq (mod $replicas 2) 0) -}}
{{- fail (printf "nats.cluster.replicas must be an odd number of at least 3, not %d: JetStream works while a majority of the servers is up, and an even number survives no more losses than one server fewer" $replicas) -}}
{{- end -}}
{{- $replicas -}}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* The stable DNS name of every server of the bundled cluster (its pods through the headless
Service), space-separated: the routes, the services' URLs and the certificate's names. */}}
{{- define "gpuop.natsPeers" -}}
{{- $name := include "gpuop.name" (dict "root" . "component" "nats") -}}
{{- $peers := list -}}
{{- range $i := until (int (include "gpuop.natsServers" .)) -}}
{{- $peers = append $peers (printf "%s-%d.%s-headless.%s.svc.%s" $name $i $name $.Release.Namespace $.Values.nats.tls.clusterDomain) -}}
{{- end -}}
{{- join " " $peers -}}
{{- end -}}

{{/* host:port of every NATS server the services know, comma-separated: the bundled NATS's
Service, each server of the bundled cluster, or nats.external.address. */}}
{{- define "gpuop.natsAddresses" -}}
{{- if not .Values.nats.enabled -}}
{{- required "nats.external.address (host:port) is required when nats.enabled is false" .Values.nats.external.address -}}
{{- else if .Values.nats.cluster.enabled -}}
{{- $addresses := list -}}
{{- range splitList " " (include "gpuop.natsPeers" .) -}}
{{- $addresses = append $addresses (printf "%s:4222" .) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- else -}}
{{- printf "%s.%s.svc:4222" (include "gpuop.name" (dict "root" . "component" "nats")) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* How many copies of each stream and bucket the services keep (GPUOP_NATS_REPLICAS): one
per bundled server, up to JetStream's 5, or nats.external.replicas. */}}
{{- define "gpuop.natsReplicas" -}}
{{- if .Values.nats.enabled -}}
{{- min 5 (int (include "gpuop.natsServers" .)) -}}
{{- else -}}
{{- $replicas := int .Values.nats.external.replicas -}}
{{- if or (lt $replicas 1) (gt $replicas 5) -}}
{{- fail (printf "nats.external.replicas must be 1 to 5 (JetStream keeps at most 5 copies), not %d" $replicas) -}}
{{- end -}}
{{- $replicas -}}
{{- end -}}
{{- end -}}

{{/* The configuration each server of the bundled cluster runs. */}}
{{- define "gpuop.natsClusterConfig" -}}
# One server of this release's cluster: deploy/nats/nats-server.conf, then cluster.conf.
include "nats-server.conf"
include "cluster.conf"
{{ end -}}

{{/* routes.conf of the bundled cluster, which deploy/nats/cluster.conf includes. */}}
{{- define "gpuop.natsRoutes" -}}
# Every server of this release's cluster (nats.cluster.replicas), by its name through the
# headless Service; written by the chart for deploy/nats/cluster.conf.
routes: [
{{- range splitList " " (include "gpuop.natsPeers" .) }}
  "nats://{{ . }}:6222"
{{- end }}
]
{{ end -}}

{{- define "gpuop.natsScheme" -}}
{{- if or .Values.nats.enabled .Values.nats.external.tls -}}tls{{- else -}}nats{{- end -}}
{{- end -}}

{{/* accounts.conf's environment variable of a user's password: driver-manager ->
DRIVER_MANAGER_PASSWORD. */}}
{{- define "gpuop.passwordKey" -}}
{{- printf "%s_PASSWORD" (. | upper | replace "-" "_") -}}
{{- end -}}

{{/* Every user of deploy/nats/accounts.conf; in callout mode also callout.conf's nats-auth. */}}
{{- define "gpuop.natsUsers" -}}
discovery discovery-cluster driver-manager device-plugin device-plugin-cluster network-manager network-manager-cluster telemetry telemetry-cluster upgrade-orchestrator observer admin
{{- if include "gpuop.natsCallout" . }} nats-auth{{ end -}}
{{- end -}}

{{/* "true" when services authenticate through the auth callout (nats.auth.mode=callout). */}}
{{- define "gpuop.natsCallout" -}}
{{- $mode := .Values.nats.auth.mode | default "callout" -}}
{{- if not (has $mode (list "static" "callout")) -}}
{{- fail (printf "nats.auth.mode must be static or callout, not %q" $mode) -}}
{{- end -}}
{{- if eq $mode "callout" -}}true{{- end -}}
{{- end -}}

{{/* Where a pod's projected NATS token and its message-id key live (callout mode). */}}
{{- define "gpuop.natsTokenDir" -}}/var/run/secrets/gpuop/nats{{- end -}}
{{- define "gpuop.natsIdsDir" -}}/var/lib/gpuop/nats-ids{{- end -}}

{{/*
The container of one service. Call with a dict:
  root      the chart's top context ($)
  service   gpuop service name (`gpuop run <service>`)
  role      node | cluster
  user      its NATS user in accounts.conf
  port      metrics port (/healthz, /readyz, /metrics)
  portName  metrics | gpu-metrics
  resources the container's resources
*/}}
{{- define "gpuop.container" -}}
{{- $root := .root -}}
name: {{ .service }}
image: {{ include "gpuop.image" $root }}
imagePullPolicy: {{ $root.Values.image.pullPolicy }}
args: ["run", {{ .service | quote }}]
env:
  - name: GPUOP_ROLE
    value: {{ .role }}
  {{- if eq .role "node" }}
  - name: GPUOP_NODE
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: GPUOP_HOST_ROOT
    value: {{ include "gpuop.hostRoot" $root }}
  - name: GPUOP_NVML
    value: {{ $root.Values.nodeAgents.nvml | quote }}
  {{- end }}
  - name: GPUOP_PREFIX
    value: {{ $root.Values.prefix | quote }}
  # /healthz, /readyz and /metrics on the pod's own address only (the node's for a
  # hostNetwork pod), not on every address of the node or the pod.
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: GPUOP_METRICS_LISTEN
    value: {{ include "gpuop.metricsListen" (dict "root" $root "port" .port) | quote }}
  {{- if $root.Values.metrics.webConfig }}
  - name: GPUOP_METRICS_WEB_CONFIG
    value: {{ include "gpuop.webConfigFile" $root }}
  {{- end }}
  - name: GPUOP_CONFIG
    value: /etc/gpuop/config.yaml
  - name: GPUOP_LOG_LEVEL
    value: {{ $root.Values.log.level }}
  - name: GPUOP_LOG_FORMAT
    value: {{ $root.Values.log.format }}
  {{- $urls := list }}
  {{- if include "gpuop.natsCallout" $root }}
  # Callout mode: the pod's projected service-account token (audience gpuop-nats), reread
  # at every reconnect, is its NATS credential; its message ids are keyed by a key of its own.
  {{- range splitList "," (include "gpuop.natsAddresses" $root) }}
  {{- $urls = append $urls (printf "%s://%s" (include "gpuop.natsScheme" $root) (trim .)) }}
  {{- end }}
  - name: GPUOP_NATS_TOKEN_FILE
    value: {{ include "gpuop.natsTokenDir" $root }}/token
  - name: GPUOP_NATS_ID_KEY_FILE
    value: {{ include "gpuop.natsIdsDir" $root }}/key
  {{- else }}
  - name: NATS_PASSWORD
    valueFrom:
      secretKeyRef:
        name: {{ include "gpuop.natsUsersSecret" $root }}
        key: {{ include "gpuop.passwordKey" .user }}
  {{- range splitList "," (include "gpuop.natsAddresses" $root) }}
  {{- $urls = append $urls (printf "%s://%s:$(NATS_PASSWORD)@%s" (include "gpuop.natsScheme" $root) $.user (trim .)) }}
  {{- end }}
  {{- end }}
  - name: GPUOP_NATS
    value: {{ join "," $urls | quote }}
  - name: GPUOP_NATS_REPLICAS
    value: {{ include "gpuop.natsReplicas" $root | quote }}
  {{- if include "gpuop.natsCaSecret" $root }}
  # Python's default TLS context (which nats-py uses for tls:// URLs) trusts the CAs of this
  # file: the image's public CAs and the NATS server's (gpuop.trustInit writes it).
  - name: SSL_CERT_FILE
    value: /etc/gpuop/trust/ca-bundle.crt
  {{- end }}
  {{- if eq .role "node" }}
  # NVML from the driver's user space the driver-manager installed (gpuop.driverUserspace),
  # where no NVIDIA container runtime puts it in the container; the GPUs' device nodes when
  # the NVIDIA container runtime is the node's (nodeAgents.runtimeClassName).
  - name: LD_LIBRARY_PATH
    value: {{ include "gpuop.hostRoot" $root }}{{ include "gpuop.driverUserspace" $root }}/current/lib
  - name: NVIDIA_VISIBLE_DEVICES
    value: all
  - name: NVIDIA_DRIVER_CAPABILITIES
    value: utility
  {{- end }}
ports:
  - name: {{ .portName }}
    containerPort: {{ .port }}
    protocol: TCP
startupProbe:
  httpGet: {path: /healthz, port: {{ .portName }}, scheme: {{ include "gpuop.probeScheme" $root }}}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: {{ .portName }}, scheme: {{ include "gpuop.probeScheme" $root }}}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ .portName }}, scheme: {{ include "gpuop.probeScheme" $root }}}
  periodSeconds: 10
  timeoutSeconds: 5
resources:
  {{- toYaml .resources | nindent 2 }}
{{- end -}}

{{/* Volume mounts every service has: its config file, the CAs it trusts, a writable /tmp. */}}
{{- define "gpuop.commonMounts" -}}
- name: config
  mountPath: /etc/gpuop/config.yaml
  subPath: config.yaml
  readOnly: true
{{- if include "gpuop.natsCaSecret" .root }}
- name: trust
  mountPath: /etc/gpuop/trust
  readOnly: true
{{- end }}
{{- if .root.Values.metrics.webConfig }}
- name: web-config
  mountPath: {{ include "gpuop.webConfigDir" . }}
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- if include "gpuop.natsCallout" .root }}
- name: nats-token
  mountPath: {{ include "gpuop.natsTokenDir" .root }}
  readOnly: true
- name: nats-ids
  mountPath: {{ include "gpuop.natsIdsDir" .root }}
{{- end }}
{{- end -}}

{{- define "gpuop.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "gpuop.name" (dict "root" .root "component" (printf "%s-config" .service)) }}
{{- if include "gpuop.natsCaSecret" .root }}
- name: nats-ca
  secret:
    secretName: {{ include "gpuop.natsCaSecret" .root }}
    items:
      - key: ca.crt
        path: ca.crt
- name: trust
  emptyDir:
    medium: Memory
    sizeLimit: 4Mi
{{- end }}
{{- with .root.Values.metrics.webConfig }}
- name: web-config
  secret:
    secretName: {{ . }}
    items:
      - key: web-config.yml
        path: web-config.yml
{{- end }}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- if include "gpuop.natsCallout" .root }}
# The NATS credential in callout mode: a token for audience gpuop-nats, bound to this pod
# (so to its node), which the kubelet rewrites at 80% of its life.
- name: nats-token
  projected:
    sources:
      - serviceAccountToken:
          audience: gpuop-nats
          expirationSeconds: {{ include "gpuop.natsTokenSeconds" .root }}
          path: token
{{- if .role }}
# The cluster role's message-id key, the same in each of its replicas (templates/nats/id-keys.yaml).
- name: nats-ids
  secret:
    secretName: {{ include "gpuop.natsIdKeysSecret" .root }}
    # readable by the container's non-root user (the pod runs no other)
    defaultMode: 0444
    items:
      - key: {{ .role }}
        path: key
{{- else }}
# This pod's message-id key (made at first start; another node's agent cannot know it).
- name: nats-ids
  emptyDir:
    sizeLimit: 1Mi
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuop.natsTokenSeconds" -}}
{{- $seconds := int .Values.nats.auth.callout.tokenExpirationSeconds -}}
{{- if lt $seconds 600 -}}
{{- fail (printf "nats.auth.callout.tokenExpirationSeconds must be at least 600 (the API server's minimum), not %d" $seconds) -}}
{{- end -}}
{{- if gt $seconds 86400 -}}
{{- fail (printf "nats.auth.callout.tokenExpirationSeconds must be at most 86400 (the callout refuses longer-lived tokens), not %d" $seconds) -}}
{{- end -}}
{{- $seconds -}}
{{- end -}}

{{/* A container that needs no privilege: not root, nothing to escalate to. */}}
{{- define "gpuop.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ include "gpuop.uid" . }}
runAsGroup: {{ include "gpuop.uid" . }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Root, for files and sockets that root owns on the host, but without any capability. */}}
{{- define "gpuop.hostRootSecurityContext" -}}
runAsUser: 0
runAsGroup: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod spec fields every node agent shares. Call with (dict "root" $ "nodeSelector" {...}). */}}
{{- define "gpuop.nodeAgentPod" -}}
{{- $root := .root -}}
automountServiceAccountToken: false
{{- if include "gpuop.natsCallout" $root }}
# callout mode: a ServiceAccount per service, which the auth callout maps to its NATS role
serviceAccountName: {{ include "gpuop.name" (dict "root" $root "component" .service) }}
{{- else }}
serviceAccountName: {{ include "gpuop.name" (dict "root" $root "component" "node-agent") }}
{{- end }}
{{- with $root.Values.nodeAgents.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.nodeAgents.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
nodeSelector:
  {{- toYaml .nodeSelector | nindent 2 }}
{{- with $root.Values.nodeAgents.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: 30
{{- end -}}

{{/* Pod labels and annotations; the config checksum restarts pods when their config changes. */}}
{{- define "gpuop.podMetadata" -}}
labels:
  {{- include "gpuop.selectorLabels" . | nindent 2 }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ .config | sha256sum }}
  {{- with .root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* A service's --config file: `<service>.config` from the values; for the orchestrator, with
its Lease in the release's namespace and the pausing operands that are deployed. Call with
(dict "root" $ "service" "discovery" "values" .Values.discovery). */}}
{{- define "gpuop.serviceConfig" -}}
{{- $config := deepCopy (default dict .values.config) -}}
{{- if eq .service "upgrade-orchestrator" -}}
{{- $operands := list -}}
{{- if .root.Values.discovery.enabled }}{{ $operands = append $operands "discovery" }}{{ end -}}
{{- if .root.Values.devicePlugin.enabled }}{{ $operands = append $operands "device-plugin" }}{{ end -}}
{{- if .root.Values.telemetry.enabled }}{{ $operands = append $operands "telemetry" }}{{ end -}}
{{- $defaults := dict "lease_namespace" .root.Release.Namespace "event_namespace" "default" "operands" $operands -}}
{{- $config = merge $config $defaults -}}
{{- end -}}
{{- if eq .service "device-plugin" -}}
{{- if hasKey $config "configs" -}}
{{- range $name, $named := $config.configs -}}
{{- include "gpuop.pluginKubeletRootDir" (dict "root" $.root "config" $named "where" (printf "devicePlugin.config.configs.%s" $name)) -}}
{{- end -}}
{{- else -}}
{{- include "gpuop.pluginKubeletRootDir" (dict "root" .root "config" $config "where" "devicePlugin.config") -}}
{{- end -}}
{{- end -}}
{{- if eq .service "telemetry" -}}
{{- include "gpuop.setKubeletRootDir" (dict "root" .root "config" $config "key" "kubelet_root_dir" "where" "telemetry.config") -}}
{{- end -}}
{{- if eq .service "network-manager" -}}
{{- $selector := list -}}
{{- range $key, $value := .root.Values.nicNodeSelector }}{{ $selector = append $selector (printf "%s=%s" $key $value) }}{{ end -}}
{{- $config = merge $config (dict "block_node_selector" (join "," $selector)) -}}
{{- end -}}
{{- if $config -}}
{{- toYaml $config -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* The cluster roles that are deployed, as a space-separated list. */}}
{{- define "gpuop.clusterRoles" -}}
{{- $roles := list -}}
{{- if and .Values.discovery.enabled .Values.discovery.cluster.enabled }}{{ $roles = append $roles "discovery-cluster" }}{{ end -}}
{{- if and .Values.devicePlugin.enabled .Values.devicePlugin.cluster.enabled }}{{ $roles = append $roles "device-plugin-cluster" }}{{ end -}}
{{- if and .Values.networkManager.enabled .Values.networkManager.cluster.enabled }}{{ $roles = append $roles "network-manager-cluster" }}{{ end -}}
{{- if and .Values.telemetry.enabled .Values.telemetry.cluster.enabled }}{{ $roles = append $roles "telemetry-cluster" }}{{ end -}}
{{- if .Values.upgradeOrchestrator.enabled }}{{ $roles = append $roles "upgrade-orchestrator" }}{{ end -}}
{{- join " " $roles -}}
{{- end -}}

{{/* The CA bundle a service trusts: the image's public CAs (driver sources, tracing
endpoints) and the CA of the NATS server, in one file, since SSL_CERT_FILE replaces the
default bundle rather than adding to it. An init container, as the gpuop image's user. */}}
{{- define "gpuop.trustInit" -}}
{{- if include "gpuop.natsCaSecret" . -}}
initContainers:
  - name: trust-nats-ca
    image: {{ include "gpuop.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      - sh
      - -c
      - cat /etc/ssl/certs/ca-certificates.crt /etc/gpuop/nats-ca/ca.crt > /etc/gpuop/trust/ca-bundle.crt
    securityContext:
      {{- include "gpuop.restrictedSecurityContext" . | nindent 6 }}
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {memory: 32Mi}
    volumeMounts:
      - name: nats-ca
        mountPath: /etc/gpuop/nats-ca
        readOnly: true
      - name: trust
        mountPath: /etc/gpuop/trust
{{- end }}
{{- end -}}

{{/* Where a node agent sees the host's paths (GPUOP_HOST_ROOT): each host path it reads is
mounted at <hostRoot><path>, the place the services look for it (libs/gpuop/host/roots.py). */}}
{{- define "gpuop.hostRoot" -}}/host{{- end -}}

{{/* A host path on the node: under nodeAgents.hostRoot (`/` on a real node). Call with
(dict "root" $ "path" "/etc/os-release"). */}}
{{- define "gpuop.nodePath" -}}
{{- $prefix := trimSuffix "/" .root.Values.nodeAgents.hostRoot -}}
{{- if eq .path "/" -}}{{ default "/" $prefix }}{{- else -}}{{ $prefix }}{{ .path }}{{- end -}}
{{- end -}}

{{/* A directory in the node's kubelet root directory (nodeAgents.kubeletRootDir), as the
host sees it: mounted, like every host path, under nodeAgents.hostRoot. Call with
(dict "root" $ "path" "plugins"). */}}
{{- define "gpuop.kubeletPath" -}}
{{- $dir := include "gpuop.kubeletRootDir" .root -}}
{{- if eq $dir "/" -}}/{{ .path }}{{- else -}}{{ $dir }}/{{ .path }}{{- end -}}
{{- end -}}

{{/* nodeAgents.kubeletRootDir, checked: an absolute path without '..', no trailing '/'. */}}
{{- define "gpuop.kubeletRootDir" -}}
{{- $dir := toString .Values.nodeAgents.kubeletRootDir -}}
{{- if or (not (hasPrefix "/" $dir)) (has ".." (splitList "/" $dir)) -}}
{{- fail (printf "nodeAgents.kubeletRootDir must be an absolute path without '..' (the kubelet's --root-dir), not %q" $dir) -}}
{{- end -}}
{{- default "/" (trimSuffix "/" $dir) -}}
{{- end -}}

{{/* Sets `key` of a service's config (a dict) to nodeAgents.kubeletRootDir, failing where
the config names another: the chart's mounts follow nodeAgents.kubeletRootDir alone. Call
with (dict "root" $ "config" $flags "key" "kubeletRootDir" "where" "devicePlugin.config.flags"). */}}
{{- define "gpuop.setKubeletRootDir" -}}
{{- $dir := include "gpuop.kubeletRootDir" .root -}}
{{- $given := get .config .key -}}
{{- if and $given (ne (default "/" (trimSuffix "/" (toString $given))) $dir) -}}
{{- fail (printf "%s.%s %q is not nodeAgents.kubeletRootDir %q: set the kubelet's root directory once, in nodeAgents.kubeletRootDir, which the node agents' mounts follow" .where .key (toString $given) $dir) -}}
{{- end -}}
{{- $_ := set .config .key $dir -}}
{{- end -}}

{{/* A device plugin config (a dict) with flags.kubeletRootDir set (gpuop.setKubeletRootDir).
Call with (dict "root" $ "config" $config "where" "devicePlugin.config"). */}}
{{- define "gpuop.pluginKubeletRootDir" -}}
{{- $flags := default dict (get .config "flags") -}}
{{- include "gpuop.setKubeletRootDir" (dict "root" .root "config" $flags "key" "kubeletRootDir" "where" (printf "%s.flags" .where)) -}}
{{- $_ := set .config "flags" $flags -}}
{{- end -}}

{{/* The driver's user space the driver-manager installs (gpuop.host.packages USERSPACE/gpu):
<version>/lib with libnvidia-ml.so.1, and the `current` link (relative) to the version in use. */}}
{{- define "gpuop.driverUserspace" -}}/opt/gpuop/gpu{{- end -}}
{{- define "gpuop.driverUserspaceMount" -}}
{{- toJson (dict "path" (include "gpuop.driverUserspace" .) "type" "DirectoryOrCreate") -}}
{{- end -}}

{{/* GPUOP_METRICS_LISTEN: the pod's IP (metrics.listen podIP, or podIPv6 in brackets), or
every address (all). Call with (dict "root" $ "port" 9401). */}}
{{- define "gpuop.metricsListen" -}}
{{- $listen := .root.Values.metrics.listen -}}
{{- if eq $listen "podIP" -}}
{{- printf "$(POD_IP):%d" (int .port) -}}
{{- else if eq $listen "podIPv6" -}}
{{- printf "[$(POD_IP)]:%d" (int .port) -}}
{{- else if eq $listen "all" -}}
{{- printf "0.0.0.0:%d" (int .port) -}}
{{- else -}}
{{- fail (printf "metrics.listen must be podIP, podIPv6 or all, not %q" $listen) -}}
{{- end -}}
{{- end -}}

{{/* Where the Prometheus web-config Secret (metrics.webConfig) is mounted, and its file. */}}
{{- define "gpuop.webConfigDir" -}}/etc/gpuop/web-config{{- end -}}
{{- define "gpuop.webConfigFile" -}}/etc/gpuop/web-config/web-config.yml{{- end -}}

{{/* HTTPS when the web-config serves TLS (metrics.scheme https). The kubelet does not verify
a probe's certificate, and basic auth guards /metrics only, so the probes need nothing else. */}}
{{- define "gpuop.probeScheme" -}}
{{- $scheme := .Values.metrics.scheme -}}
{{- if not (has $scheme (list "http" "https")) -}}
{{- fail (printf "metrics.scheme must be http or https, not %q" $scheme) -}}
{{- end -}}
{{- if and (eq $scheme "https") (not .Values.metrics.webConfig) -}}
{{- fail "metrics.scheme https needs metrics.webConfig: the Secret whose web-config.yml has tls_server_config" -}}
{{- end -}}
{{- upper $scheme -}}
{{- end -}}

{{/*
The host paths a node agent reads (or writes), each mounted at <hostRoot><path>: volume
mounts and volumes from one list, so the two never disagree. Each entry is a dict:
  path   the host path
  type   its hostPath type (Directory, File, DirectoryOrCreate)
  write  true for the few it writes; read-only otherwise
Call with (dict "root" $ "paths" (list ...)).
*/}}
{{- define "gpuop.hostPathName" -}}
{{- printf "host%s" (. | replace "/" "-" | replace "." "-" | replace "_" "-") | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuop.hostPathMounts" -}}
{{- $root := .root -}}
{{- range .paths }}
- name: {{ include "gpuop.hostPathName" .path }}
  mountPath: {{ printf "%s%s" (include "gpuop.hostRoot" $root) .path }}
  readOnly: {{ not .write }}
{{- end }}
{{- end -}}

{{- define "gpuop.hostPathVolumes" -}}
{{- $root := .root -}}
{{- range .paths }}
- name: {{ include "gpuop.hostPathName" .path }}
  hostPath:
    path: {{ include "gpuop.nodePath" (dict "root" $root "path" .path) }}
    type: {{ .type }}
{{- end }}
{{- end -}}

{{/* The host's sysfs without its other filesystems (debugfs, securityfs, bpffs, cgroupfs,
efivarfs under /sys/kernel, /sys/fs and /sys/firmware): the PCI functions, device classes
(net, infiniband, dmi) and the devices their links lead to. */}}
{{- define "gpuop.sysfsPaths" -}}
{{- toJson (list
  (dict "path" "/sys/bus" "type" "Directory")
  (dict "path" "/sys/class" "type" "Directory")
  (dict "path" "/sys/devices" "type" "Directory")) -}}
{{- end -}}

{{/* The node affinity of everything that holds a key to the cluster (every cluster role,
the orchestrator, the callout and the bundled NATS servers): onto the nodes that carry
clusterRoles.nodeLabel, a label only admins can set, and off the nodes clusterRoles.avoidNodes
matches (GPU nodes by default), which the orchestrator drains and reboots. avoidNodes alone
would not do: a GPU node's kubelet may set or remove labels such as nvidia.com/gpu.present
on its own Node, and so make it eligible; the NodeRestriction admission plugin refuses a
kubelet every label under node-restriction.kubernetes.io/ (and node-role.kubernetes.io/). */}}
{{- define "gpuop.clusterNodeAffinity" -}}
{{- $expressions := list }}
{{- with .Values.clusterRoles.nodeLabel }}
{{- if .key }}
{{- if not (or (hasPrefix "node-restriction.kubernetes.io/" .key) (hasPrefix "node-role.kubernetes.io/" .key)) }}
{{- fail (printf "clusterRoles.nodeLabel.key %q: a kubelet may set that label on its own Node; use one under node-restriction.kubernetes.io/ (or node-role.kubernetes.io/), which the NodeRestriction admission plugin keeps from kubelets, or an empty key for none" .key) }}
{{- end }}
{{- $expressions = append $expressions (dict "key" .key "operator" "In" "values" (required "clusterRoles.nodeLabel.values: the label's values that make a node eligible" .values)) }}
{{- end }}
{{- end }}
{{- $expressions = concat $expressions (.Values.clusterRoles.avoidNodes | default list) }}
{{- with $expressions -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          {{- toYaml . | nindent 10 }}
{{- end -}}
{{- end -}}

{{/* How Prometheus talks to a service that runs with metrics.webConfig: its scheme, the
TLS settings that verify it, and the basic auth it asks for. */}}
{{- define "gpuop.scrapeAuth" -}}
scheme: {{ include "gpuop.probeScheme" . | lower }}
{{- with .Values.metrics.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.metrics.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
