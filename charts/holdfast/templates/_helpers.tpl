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
