{{/*
Names, labels and the rendered controller configuration.
*/}}

{{- define "kube-discovery.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: the release name when it already contains the chart
name, else "<release>-<chart>". Truncated to 63 characters (DNS label).
*/}}
{{- define "kube-discovery.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kube-discovery.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-discovery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-discovery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels. Note: `app.kubernetes.io/managed-by: Helm` marks the chart's own
objects; the DiscoveredServices the controller writes carry
`app.kubernetes.io/managed-by: kube-discovery` instead.
*/}}
{{- define "kube-discovery.labels" -}}
helm.sh/chart: {{ include "kube-discovery.chart" . }}
{{ include "kube-discovery.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kube-discovery
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kube-discovery.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kube-discovery.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image. `global.imageRegistry` replaces the registry host of
`image.repository` (its first path part when that has a "." or ":" or is
"localhost"), or is prepended when the repository names none.
*/}}
{{- define "kube-discovery.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $repo := .Values.image.repository }}
{{- $registry := "" }}
{{- with .Values.global }}{{ $registry = .imageRegistry | default "" }}{{ end }}
{{- if $registry }}
{{- $parts := splitList "/" $repo }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repo = join "/" (rest $parts) }}
{{- end }}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/*
The Secret with the bearer token of the dump and nodes APIs: the given one,
else the generated `<fullname>-api-token` (with `create`), else none ("").
*/}}
{{- define "kube-discovery.authSecretName" -}}
{{- $a := .Values.http.authTokenSecret }}
{{- if $a.name }}
{{- $a.name }}
{{- else if $a.create }}
{{- printf "%s-api-token" (include "kube-discovery.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Key of the token in that Secret. */}}
{{- define "kube-discovery.authSecretKey" -}}
{{- .Values.http.authTokenSecret.key | default "token" }}
{{- end }}

{{/*
The Secret with the bearer token of the xDS server (only with `xds.enabled`):
the given one, else the generated `<fullname>-xds-token` (with `create`), else
none ("").
*/}}
{{- define "kube-discovery.xdsAuthSecretName" -}}
{{- $a := .Values.xds.authTokenSecret }}
{{- if .Values.xds.enabled }}
{{- if $a.name }}
{{- $a.name }}
{{- else if $a.create }}
{{- printf "%s-xds-token" (include "kube-discovery.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The xDS Service: `<fullname>-xds`. */}}
{{- define "kube-discovery.xdsServiceName" -}}
{{- printf "%s-xds" (include "kube-discovery.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Key of the token in that Secret. */}}
{{- define "kube-discovery.xdsAuthSecretKey" -}}
{{- .Values.xds.authTokenSecret.key | default "token" }}
{{- end }}

{{/* The xDS settings (`kube_discovery.xds`) as a YAML dict; "{}" when off. */}}
{{- define "kube-discovery.xdsConfig" -}}
{{- $x := .Values.xds }}
{{- $out := dict }}
{{- if $x.enabled }}
{{- if eq (int $x.port) (int .Values.http.port) }}
{{- fail (printf "xds.port: %d is also http.port; the xDS and HTTP servers need different ports" (int $x.port)) }}
{{- end }}
{{- if and $x.tls.clientCA.secretName (not $x.tls.secretName) }}
{{- fail "xds.tls.clientCA.secretName needs xds.tls.secretName (client certificates are checked on a TLS connection)" }}
{{- end }}
{{- $_ := set $out "addr" (printf "0.0.0.0:%d" (int $x.port)) }}
{{- if include "kube-discovery.xdsAuthSecretName" . }}{{ $_ := set $out "auth_token_file" "/etc/kube-discovery/xds-auth/token" }}{{ end }}
{{- if $x.tls.secretName }}
{{- $_ := set $out "cert_file" "/etc/kube-discovery/xds-tls/tls.crt" }}
{{- $_ := set $out "key_file" "/etc/kube-discovery/xds-tls/tls.key" }}
{{- end }}
{{- if $x.tls.clientCA.secretName }}{{ $_ := set $out "client_ca_file" "/etc/kube-discovery/xds-client-ca/ca.crt" }}{{ end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "kube-discovery.leaseName" -}}
{{- default (include "kube-discovery.fullname" .) .Values.controller.leaderElection.leaseName }}
{{- end }}

{{- define "kube-discovery.snapshotNamespace" -}}
{{- default .Release.Namespace .Values.controller.configMapSnapshot.namespace }}
{{- end }}

{{- define "kube-discovery.snapshotName" -}}
{{- default (printf "%s-snapshot" (include "kube-discovery.fullname" .)) .Values.controller.configMapSnapshot.name }}
{{- end }}

{{/* Where the credentials of remote cluster <id> are mounted. */}}
{{- define "kube-discovery.clusterDir" -}}
{{- printf "/etc/kube-discovery/clusters/%s" . }}
{{- end }}

{{/*
The APISIX-compatible settings shared by the single-cluster object and each
multi-cluster entry: namespace_selector, label_selector, default_weight,
watch_endpoint_slices. Returns a YAML dict (used with fromYaml).
Empty values are left out so the controller's defaults apply.
*/}}
{{- define "kube-discovery.commonDiscovery" -}}
{{- $out := dict }}
{{- with .namespace_selector }}{{ $_ := set $out "namespace_selector" . }}{{ end }}
{{- with .label_selector }}{{ $_ := set $out "label_selector" . }}{{ end }}
{{- if hasKey . "default_weight" }}{{ if not (kindIs "invalid" .default_weight) }}{{ $_ := set $out "default_weight" (int64 .default_weight) }}{{ end }}{{ end }}
{{- if hasKey . "watch_endpoint_slices" }}{{ if not (kindIs "invalid" .watch_endpoint_slices) }}{{ $_ := set $out "watch_endpoint_slices" .watch_endpoint_slices }}{{ end }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{/*
The in-cluster connection (the pod's own API server and ServiceAccount token),
written out explicitly for a multi-cluster entry with `inCluster: true`.
*/}}
{{- define "kube-discovery.inClusterConnection" -}}
service:
  schema: https
  host: ${KUBERNETES_SERVICE_HOST}
  port: ${KUBERNETES_SERVICE_PORT}
  ssl_verify: true
  ca_file: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
client:
  token_file: /var/run/secrets/kubernetes.io/serviceaccount/token
{{- end }}

{{/* One multi-cluster entry of `discovery.kubernetes`. Input: the entry. */}}
{{- define "kube-discovery.clusterEntry" -}}
{{- $c := . }}
{{- $dir := include "kube-discovery.clusterDir" $c.id }}
{{- $out := dict "id" $c.id }}
{{- if $c.inCluster }}
{{- $out = merge $out (include "kube-discovery.inClusterConnection" . | fromYaml) }}
{{- else if $c.kubeconfigSecret }}
{{- $_ := set $out "kubeconfig" (printf "%s/kubeconfig" $dir) }}
{{- with $c.context }}{{ $_ := set $out "context" . }}{{ end }}
{{- else }}
{{- $service := deepCopy (default (dict) $c.service) }}
{{- if $c.caSecret }}{{ $_ := set $service "ca_file" (printf "%s/ca.crt" $dir) }}{{ end }}
{{- $_ := set $out "service" $service }}
{{- $client := deepCopy (default (dict) $c.client) }}
{{- if $c.tokenSecret }}{{ $_ := set $client "token_file" (printf "%s/token" $dir) }}{{ end }}
{{- $_ := set $out "client" $client }}
{{- end }}
{{- $out = merge $out (include "kube-discovery.commonDiscovery" $c | fromYaml) }}
{{- toYaml $out }}
{{- end }}

{{/* The whole config.yaml the controller reads (`kube-discovery run --config`). */}}
{{- define "kube-discovery.config" -}}
{{- $d := .Values.discovery }}
{{- $kubernetes := dict }}
{{- if $d.clusters }}
{{- $ids := dict }}
{{- $entries := list }}
{{- range $i, $c := $d.clusters }}
{{- if hasKey $ids $c.id }}
{{- fail (printf "discovery.clusters[%d].id: duplicate cluster id %q (ids must be unique)" $i $c.id) }}
{{- end }}
{{- $_ := set $ids $c.id true }}
{{- $ways := list }}
{{- if $c.inCluster }}{{ $ways = append $ways "inCluster" }}{{ end }}
{{- if $c.kubeconfigSecret }}{{ $ways = append $ways "kubeconfigSecret" }}{{ end }}
{{- if or $c.service $c.client $c.tokenSecret $c.caSecret }}{{ $ways = append $ways "service/client/tokenSecret/caSecret" }}{{ end }}
{{- if gt (len $ways) 1 }}
{{- fail (printf "discovery.clusters[%d] (id %q): choose one way to connect, not %s" $i $c.id (join " + " $ways)) }}
{{- end }}
{{- if and $c.context (not $c.kubeconfigSecret) }}
{{- fail (printf "discovery.clusters[%d] (id %q): context needs kubeconfigSecret" $i $c.id) }}
{{- end }}
{{- if and $c.tokenSecret $c.client }}
{{- fail (printf "discovery.clusters[%d] (id %q): tokenSecret and client are exclusive (tokenSecret becomes client.token_file)" $i $c.id) }}
{{- end }}
{{- if and $c.caSecret $c.service $c.service.ca_file }}
{{- fail (printf "discovery.clusters[%d] (id %q): caSecret and service.ca_file are exclusive (caSecret becomes service.ca_file)" $i $c.id) }}
{{- end }}
{{- if and $c.client $c.client.token $c.client.token_file }}
{{- fail (printf "discovery.clusters[%d] (id %q): client.token and client.token_file are exclusive" $i $c.id) }}
{{- end }}
{{- if and (not $c.inCluster) (not $c.kubeconfigSecret) (not $c.tokenSecret) (not (and $c.client (or $c.client.token $c.client.token_file))) }}
{{- fail (printf "discovery.clusters[%d] (id %q): set one of inCluster, tokenSecret, kubeconfigSecret, client.token_file or client.token" $i $c.id) }}
{{- end }}
{{- if and (not $c.inCluster) (not $c.kubeconfigSecret) (not (and $c.service $c.service.host)) }}
{{- fail (printf "discovery.clusters[%d] (id %q): service.host is required (or use inCluster / kubeconfigSecret)" $i $c.id) }}
{{- end }}
{{- $entries = append $entries (include "kube-discovery.clusterEntry" $c | fromYaml) }}
{{- end }}
{{- $kubernetes = $entries }}
{{- else }}
{{- $k := $d.kubernetes }}
{{- with $k.service }}{{ $_ := set $kubernetes "service" . }}{{ end }}
{{- with $k.client }}{{ $_ := set $kubernetes "client" . }}{{ end }}
{{- $kubernetes = merge $kubernetes (include "kube-discovery.commonDiscovery" $k | fromYaml) }}
{{- end }}
{{- $c := .Values.controller }}
{{- $kd := dict }}
{{- $http := dict "addr" (printf "0.0.0.0:%d" (int .Values.http.port)) }}
{{- if include "kube-discovery.authSecretName" . }}{{ $_ := set $http "auth_token_file" "/etc/kube-discovery/http-auth/token" }}{{ end }}
{{- $_ := set $kd "http" $http }}
{{- if .Values.xds.enabled }}{{ $_ := set $kd "xds" (include "kube-discovery.xdsConfig" . | fromYaml) }}{{ end }}
{{- $_ := set $kd "instance" (default (.Release.Name | replace "." "-") $c.instance) }}
{{- with $c.adoptInstances }}{{ $_ := set $kd "adopt_instances" . }}{{ end }}
{{- with $c.watchTimeout }}{{ $_ := set $kd "watch_timeout" . }}{{ end }}
{{- with $c.requestTimeout }}{{ $_ := set $kd "request_timeout" . }}{{ end }}
{{- with $c.unreadyAfter }}{{ $_ := set $kd "unready_after" . }}{{ end }}
{{- /* Shutdown finishes 5 s before the kubelet's SIGKILL. */}}
{{- $_ := set $kd "shutdown_timeout" (printf "%ds" (max 1 (sub (int .Values.terminationGracePeriodSeconds) 5))) }}
{{- $_ := set $kd "write_concurrency" (int64 $c.writeConcurrency) }}
{{- $_ := set $kd "write_qps" $c.writeQps }}
{{- $_ := set $kd "write_qps_start" $c.writeQpsStart }}
{{- with $c.coalesceWindow }}{{ $_ := set $kd "coalesce_window" . }}{{ end }}
{{- $_ := set $kd "coalesce_leading_edge" $c.coalesceLeadingEdge }}
{{- $_ := set $kd "drain_terminating" $c.drainTerminating }}
{{- $_ := set $kd "index_port_numbers" $c.indexPortNumbers }}
{{- $_ := set $kd "topology" $c.topology }}
{{- $_ := set $kd "service_port_aliases" $c.servicePortAliases }}
{{- $_ := set $kd "export" $c.export }}
{{- if $c.externalName.enabled }}{{ $_ := set $kd "external_name" (dict "enabled" true "allow" $c.externalName.allow) }}{{ end }}
{{- $sinks := dict }}
{{- $_ := set $sinks "discoveredservices" (include "kube-discovery.dsvcSink" . | fromYaml) }}
{{- $_ := set $sinks "configmap" (dict "enabled" $c.configMapSnapshot.enabled "namespace" (include "kube-discovery.snapshotNamespace" .) "name" (include "kube-discovery.snapshotName" .)) }}
{{- $_ := set $kd "sinks" $sinks }}
{{- $le := dict "enabled" $c.leaderElection.enabled "lease_name" (include "kube-discovery.leaseName" .) "lease_namespace" .Release.Namespace }}
{{- with $c.leaderElection.leaseDuration }}{{ $_ := set $le "lease_duration" . }}{{ end }}
{{- with $c.leaderElection.renewDeadline }}{{ $_ := set $le "renew_deadline" . }}{{ end }}
{{- with $c.leaderElection.retryPeriod }}{{ $_ := set $le "retry_period" . }}{{ end }}
{{- $_ := set $kd "leader_election" $le }}
{{- $config := dict "discovery" (dict "kubernetes" $kubernetes) "kube_discovery" $kd }}
{{- toYaml $config }}
{{- end }}

{{/* sinks.discoveredservices */}}
{{- define "kube-discovery.dsvcSink" -}}
{{- $s := .Values.controller.discoveredServices }}
{{- $out := dict "enabled" $s.enabled "namespace_mode" $s.namespaceMode }}
{{- if eq $s.namespaceMode "fixed" }}
{{- $_ := set $out "namespace" (default .Release.Namespace $s.namespace) }}
{{- else if $s.namespace }}
{{- fail "controller.discoveredServices.namespace is only used with namespaceMode: fixed" }}
{{- end }}
{{- toYaml $out }}
{{- end }}
