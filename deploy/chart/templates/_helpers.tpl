{{/*
Labels every object of the chart carries besides its own, as `helm create`
writes them (without app.kubernetes.io/name: deploy/base uses that one as the
pods' selector, so an object has it only where the base has it).
*/}}
{{- define "subres.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The one image the replicas and the agents run (deploy/base's `images:` entry). */}}
{{- define "subres.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/*
The certificates' Secrets: the chart writes them (selfSigned), cert-manager
issues them (certManager), or you made them (existingSecrets).
*/}}
{{- define "subres.servingSecret" -}}{{ .Values.certificates.secrets.serving }}{{- end }}
{{- define "subres.agentSecret" -}}{{ .Values.certificates.secrets.agent }}{{- end }}
{{- define "subres.replicaSecret" -}}{{ .Values.certificates.secrets.replica }}{{- end }}

{{/* A PEM value the selfSigned choice cannot do without: its name and where it comes from. */}}
{{- define "subres.pem" -}}
{{- $hint := "run `subres certs --out deploy/certs` and pass -f deploy/certs/values.yaml" -}}
{{- required (printf "certificates.selfSigned.%s is empty: %s" .name $hint) .value | b64enc -}}
{{- end }}

{{/* The recordings configuration (subres --config), also hashed into the pods' annotation. */}}
{{- define "subres.recordingsConfig" -}}
{{- with .Values.recordings -}}
consoles:
  recordings:
    directory: /var/lib/subres/recordings
    maxFileBytes: {{ int64 .maxFileBytes }}
    maxNamespaceBytes: {{ int64 .maxNamespaceBytes }}
    maxTotalBytes: {{ int64 .maxTotalBytes }}
    {{- if .maxAge }}
    maxAge: {{ int64 .maxAge }}
    {{- end }}
{{- end }}
{{- end }}
