{{/* Chart name, overridable. */}}
{{- define "gpuhealth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object's name: the release name, plus the chart name unless it is in it. */}}
{{- define "gpuhealth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpuhealth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuhealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "agent"). */}}
{{- define "gpuhealth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuhealth.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuhealth.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpuhealth.agent.name" -}}
{{- printf "%s-agent" (include "gpuhealth.fullname" .) -}}
{{- end -}}

{{- define "gpuhealth.agent.serviceAccountName" -}}
{{- default (include "gpuhealth.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{/* The username the API server gives the agent's ServiceAccount; the admission policy matches it. */}}
{{- define "gpuhealth.agent.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpuhealth.agent.serviceAccountName" .) -}}
{{- end -}}

{{- define "gpuhealth.extender.name" -}}
{{- printf "%s-extender" (include "gpuhealth.fullname" .) -}}
{{- end -}}

{{- define "gpuhealth.extender.serviceAccountName" -}}
{{- default (include "gpuhealth.extender.name" .) .Values.extender.serviceAccount.name -}}
{{- end -}}

{{- define "gpuhealth.breaker.name" -}}
{{- printf "%s-breaker-controller" (include "gpuhealth.fullname" .) -}}
{{- end -}}

{{/* Environment of the agent's containers (agent, device plugin). */}}
{{- define "gpuhealth.agent.env" -}}
{{- $hostMounts := eq .Values.agent.nvml.mode "hostMounts" -}}
# --node-name defaults to $NODE_NAME: the node this pod runs on.
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
# The circuit breaker's ConfigMap and the remediation slots live in the release namespace.
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# Remediation never counts its own pod among the GPU operator's components that hold a GPU.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# The Go runtime collects harder near the container's memory limit instead of being
# killed by it.
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
{{- if not $hostMounts }}
# Ask the NVIDIA container runtime for every GPU's device node and the management
# library (utility), nothing for compute.
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- end }}
{{- end -}}

{{/*
NVML arguments of the agent's containers (agent, device plugin). The driver's library is found
under the driver root and loaded by its path, so that its own dependencies resolve from the
image's glibc: no host directory goes on LD_LIBRARY_PATH (a host glibc that is not the image's
would then be taken for the whole process, which cannot start).
*/}}
{{- define "gpuhealth.agent.nvmlArgs" -}}
{{- if eq .Values.agent.backend "nvml" }}
{{- if eq .Values.agent.nvml.mode "hostMounts" }}
- --driver-root=/driver-root
{{- end }}
{{- with .Values.agent.nvml.libraryPaths }}
- --nvml-library-paths={{ join "," . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts the agent's containers share. */}}
{{- define "gpuhealth.agent.mounts" -}}
- name: config
  mountPath: /etc/gpuhealth
  readOnly: true
- name: checkpoint
  mountPath: /var/lib/gpuhealth
{{- if eq .Values.agent.backend "sim" }}
- name: scenario
  mountPath: /etc/gpuhealth-sim
  readOnly: true
{{- end }}
{{- if include "gpuhealth.agent.kmsgRelay" . | eq "true" }}
# The kmsg relay's socket: the kernel log's NVIDIA lines, read by the kmsg-relay container.
- name: kmsg-relay
  mountPath: {{ include "gpuhealth.agent.kmsgRelayDir" . }}
  readOnly: true
{{- end }}
# The API credentials (the kube-api-access volume): these containers only, never the relay.
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- if eq .Values.agent.nvml.mode "hostMounts" }}
- name: dev
  mountPath: /dev
- name: driver-root
  mountPath: /driver-root
  readOnly: true
{{- end }}
{{- end -}}

{{/*
"true" when the agent reads the kernel log: config.kernelLog.enabled, on unless set to false.
*/}}
{{- define "gpuhealth.agent.kernelLog" -}}
{{- $kernelLog := .Values.config.kernelLog | default dict -}}
{{- or (not (hasKey $kernelLog "enabled")) $kernelLog.enabled -}}
{{- end -}}

{{/*
"true" when the kmsg-relay container reads the host's kernel log for the agent and the device
plugin: the kernel log on and the NVML backend (the simulator reads no kernel log of its node).
*/}}
{{- define "gpuhealth.agent.kmsgRelay" -}}
{{- and (include "gpuhealth.agent.kernelLog" . | eq "true") (eq .Values.agent.backend "nvml") -}}
{{- end -}}

{{/* The directory of the kmsg relay's socket (an emptyDir), and the socket. */}}
{{- define "gpuhealth.agent.kmsgRelayDir" -}}/run/gpuhealth-kmsg{{- end -}}
{{- define "gpuhealth.agent.kmsgRelaySocket" -}}{{ include "gpuhealth.agent.kmsgRelayDir" . }}/relay.sock{{- end -}}

{{/*
"true" when the agent validates repaired GPUs: config.remediation.validation.enabled, which needs
config.remediation.enabled (the agent refuses the config otherwise, on every node: fail here).
*/}}
{{- define "gpuhealth.agent.validation" -}}
{{- $remediation := .Values.config.remediation | default dict -}}
{{- $validation := $remediation.validation | default dict -}}
{{- if and $validation.enabled (not $remediation.enabled) -}}
{{- fail "config.remediation.validation.enabled needs config.remediation.enabled: validation is a step of remediation" -}}
{{- end -}}
{{- if and $remediation.enabled $validation.enabled -}}
true
{{- else -}}
false
{{- end -}}
{{- end -}}

{{/*
"true" when an init container copies dcgmi from agent.validation.dcgmImage into the agent
(validation on and the image set).
*/}}
{{- define "gpuhealth.agent.dcgmCopy" -}}
{{- if and (include "gpuhealth.agent.validation" . | eq "true") (.Values.agent.validation).dcgmImage -}}
true
{{- else -}}
false
{{- end -}}
{{- end -}}

{{/* Where the agent finds the copied dcgmi, its libraries and its loader. */}}
{{- define "gpuhealth.agent.dcgmDir" -}}/opt/gpuhealth/dcgm{{- end -}}

{{/*
The init container's script: copies dcgmi ($DCGMI: a path, or a name in PATH), the libraries ldd
resolves for it (under the names it asks for, symlinks followed), glibc's companions beside its
libc (which libraries it loads later may need) and its dynamic loader (as ld.so) into $DEST, then
checks with that loader that every library resolves inside $DEST. A copy that fails leaves $DEST
empty and says why in the container's log, but never keeps the agent from starting: validations
then end with no verdict (GPUValidationError Events) and the GPUs they hold stay out. test/helm
runs this script on this machine's own binaries.
*/}}
{{- define "gpuhealth.agent.dcgmCopyScript" -}}
set -u
copy() {
  src=$(command -v "$DCGMI") || { echo "$DCGMI not found in the image (agent.validation.dcgmiPath)"; return 1; }
  mkdir -p "$DEST/lib"
  ldd "$src" > "$DEST/ldd.txt" || { cat "$DEST/ldd.txt"; echo "ldd $src failed: not a dynamic executable?"; return 1; }
  if grep -q "not found" "$DEST/ldd.txt"; then cat "$DEST/ldd.txt"; echo "$src needs libraries the image lacks"; return 1; fi
  loader=""
  libc=""
  while read -r name arrow path rest; do
    if [ "$arrow" != "=>" ]; then path=$name; fi
    case "$path" in /*) ;; *) continue ;; esac
    base=${name##*/}
    case "$base" in
      ld-linux*|ld64.so*) loader=$path; continue ;;
      libc.so.*) libc=$path ;;
    esac
    cp -L "$path" "$DEST/lib/$base"
  done < "$DEST/ldd.txt"
  [ -n "$loader" ] || { cat "$DEST/ldd.txt"; echo "ldd names no dynamic loader for $src"; return 1; }
  if [ -n "$libc" ]; then
    for lib in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
      if [ -e "${libc%/*}/$lib" ] && [ ! -e "$DEST/lib/$lib" ]; then cp -L "${libc%/*}/$lib" "$DEST/lib/$lib"; fi
    done
  fi
  cp -L "$loader" "$DEST/ld.so"
  cp -L "$src" "$DEST/dcgmi"
  "$DEST/ld.so" --library-path "$DEST/lib" --list "$DEST/dcgmi" > "$DEST/ldd.txt"
  while read -r name arrow path rest; do
    if [ "$arrow" = "=>" ]; then
      case "$path" in "$DEST/lib/"*|"$DEST/ld.so") ;; *) cat "$DEST/ldd.txt"; echo "the copy of $src resolves $name outside $DEST/lib"; return 1 ;; esac
    fi
  done < "$DEST/ldd.txt"
  rm -f "$DEST/ldd.txt"
  echo "copied $src, its loader $loader and $(ls "$DEST/lib" | wc -l) libraries to $DEST"
}
# Not "if ! copy": a command whose status is tested runs without set -e.
(set -e; copy)
if [ $? -ne 0 ]; then
  rm -rf "$DEST"/*
  echo "no dcgmi for the agent: its validations will end with no verdict (GPUValidationError) until this is fixed"
fi
{{- end -}}
