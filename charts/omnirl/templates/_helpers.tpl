{{/* Name of the release's objects (trimmed to 52 so suffixes fit 63). */}}
{{- define "omnirl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "omnirl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "omnirl.labels" -}}
{{ include "omnirl.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: omnirl
{{- end -}}

{{- define "omnirl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "omnirl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator watches (namespaced mode), as a list. */}}
{{- define "omnirl.watchNamespaces" -}}
{{- $namespaces := .Values.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{- define "omnirl.image" -}}
{{- /* toString: `--set image.tag=2` gives a number, which %s would print as %!s(int64=2) */ -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag | toString) -}}
{{- end -}}

{{- define "omnirl.redisSecretName" -}}
{{- default (printf "%s-redis" (include "omnirl.fullname" .)) .Values.redis.existingSecret -}}
{{- end -}}

{{- define "omnirl.redisUrl" -}}
{{- if .Values.redis.bundled -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "omnirl.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.bundled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* The bundled Redis password: values, else the existing Secret's, else generated once per render. */}}
{{- define "omnirl.redisPassword" -}}
{{- if not .Values.redis._password -}}
{{- $password := .Values.redis.password -}}
{{- if not $password -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "omnirl.redisSecretName" .) -}}
{{- if and $existing $existing.data $existing.data.password -}}
{{- $password = b64dec $existing.data.password -}}
{{- else -}}
{{- $password = randAlphaNum 32 -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values.redis "_password" $password -}}
{{- end -}}
{{- .Values.redis._password -}}
{{- end -}}
