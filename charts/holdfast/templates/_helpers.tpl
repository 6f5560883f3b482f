{{/* The container image: repository@digest when a digest is set, else repository:tag. */}}
{{- define "holdfast.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* The policy file, as manifests/base/webhook/policy.yaml writes the shipped one. */}}
{{- define "holdfast.policy" -}}
# holdfast's validating policy (README.md, "The policy file"); mounted at /etc/holdfast/policy.yaml.
# As shipped: any registry is allowed, and only namespaces labelled
# holdfast.dev/require-digests=true are held to digests (what could not be pinned is denied there).
allowedRegistries: {{ toJson .Values.policy.allowedRegistries }}
requireDigestsLabel: {{ .Values.policy.requireDigestsLabel }}
mode: {{ .Values.policy.mode }}
{{ end -}}

{{/* The policy ConfigMap's name: kustomize's configMapGenerator suffix, so a new policy rolls
the webhook Deployment as it does with kustomize: the first 10 hex digits of the SHA-256 of
{"data","kind","name"} as JSON, with 0 1 3 a e spelled g h k m t. (kustomize's hasher looks the
name up as one field called "metadata/name", finds none and hashes "" — sigs.k8s.io/kustomize/api
hasher.getNodeValues; so does this.) */}}
{{- define "holdfast.policyName" -}}
{{- $encoded := toJson (dict "data" (dict "policy.yaml" (include "holdfast.policy" .)) "kind" "ConfigMap" "name" "") -}}
{{- $hash := sha256sum $encoded | trunc 10 | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" -}}
holdfast-policy-{{ $hash }}
{{- end -}}

{{/* Registry and mirror flags both binaries take. */}}
{{- define "holdfast.registryArgs" -}}
{{- range .Values.insecureRegistries }}
- --insecure-registry={{ . }}
{{- end }}
{{- with .Values.mirror }}
{{- if .registry }}
- --mirror-registry={{ .registry }}
- --mirror-prefix={{ .prefix }}
{{- if .namespaceSelector }}
- --mirror-namespace-selector={{ .namespaceSelector }}
{{- end }}
{{- if .pullSecret }}
- --mirror-pull-secret={{ .pullSecret }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* registryCA.configMap or .secret: the flag, the mount and the volume (components/registry-ca). */}}
{{- define "holdfast.registryCA" -}}
{{- if and .Values.registryCA.configMap .Values.registryCA.secret }}
{{- fail "registryCA: set configMap or secret, not both" }}
{{- end }}
{{- or .Values.registryCA.configMap .Values.registryCA.secret }}
{{- end -}}
{{- define "holdfast.registryCAArg" -}}
{{- if include "holdfast.registryCA" . }}
- --registry-ca-file=/etc/holdfast-registry-ca/ca.crt
{{- end }}
{{- end -}}
{{- define "holdfast.registryCAMount" -}}
{{- if include "holdfast.registryCA" . }}
- mountPath: /etc/holdfast-registry-ca
  name: registry-ca
  readOnly: true
{{- end }}
{{- end -}}
{{- define "holdfast.registryCAVolume" -}}
{{- if .Values.registryCA.configMap }}
- configMap:
    name: {{ .Values.registryCA.configMap }}
  name: registry-ca
{{- else if .Values.registryCA.secret }}
- name: registry-ca
  secret:
    secretName: {{ .Values.registryCA.secret }}
{{- end }}
{{- end -}}

{{/* Each webhook's namespaceSelector expressions after the shipped ones. */}}
{{- define "holdfast.namespaceSelector" -}}
{{- with .Values.namespaceSelector.matchExpressions }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "holdfast.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A component's pod template metadata: the chart's labels, then podLabels and podAnnotations.
Called with (list $ "webhook") or (list $ "controller"). */}}
{{- define "holdfast.podMetadata" -}}
{{- $component := index . 1 -}}
{{- $values := index (index . 0).Values $component -}}
metadata:
  {{- with $values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  labels:
    {{- with $values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    app.kubernetes.io/component: {{ $component }}
    app.kubernetes.io/name: holdfast
{{- end -}}

{{/* A component's scheduling: affinity, nodeSelector, tolerations, topologySpreadConstraints,
priorityClassName (each only when set). */}}
{{- define "holdfast.scheduling" -}}
{{- $values := index (index . 0).Values (index . 1) -}}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* At least one half is on. */}}
{{- define "holdfast.halves" -}}
{{- if not (or .Values.carvel.enabled .Values.korifi.enabled) -}}
{{- fail "carvel.enabled and korifi.enabled are both false: nothing to install" -}}
{{- end -}}
{{- end -}}

{{- /* The pinning policy is on: the Carvel half, and pinningPolicy.enabled (auto: when the API
server serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, or is Kubernetes >= 1.36,
where that is GA and on by default, so that no install on 1.30 to 1.35 fails on a kind its API
server does not know. The version too: the Carvel package's helmTemplate step passes the
cluster's version, but its API list names group/versions only). */}}
{{- define "holdfast.pinningPolicy" -}}
{{- $on := .Values.pinningPolicy.enabled -}}
{{- if eq (toString $on) "auto" -}}
{{- $on = or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.carvel.enabled $on }}true{{ end -}}
{{- end -}}

{{/* Whether the controller reads tenant Secrets: only for the Carvel half, unless secrets.read
is false (components/no-secret-reads). */}}
{{- define "holdfast.readSecrets" -}}
{{- if and .Values.carvel.enabled .Values.secrets.read }}true{{ end -}}
{{- end -}}

{{/*
The proxy environment of both containers (proxy.*): rendered only with a proxy set.
*/}}
{{- define "holdfast.proxyEnv" -}}
{{- if or .Values.proxy.https .Values.proxy.http }}
{{- with .Values.proxy.https }}
- name: HTTPS_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with .Values.proxy.http }}
- name: HTTP_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with .Values.proxy.noProxy }}
- name: NO_PROXY
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
