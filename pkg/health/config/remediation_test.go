package config_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestRemediationIsOffByDefaultAndDefaults(t *testing.T) {
	c := mustParse(t, "")
	if c.Remediation.Enabled {
		t.Fatal("remediation must be off by default")
	}
	t.Setenv("POD_NAMESPACE", "")
	r := c.Remediation.WithDefaults()
	if *r.MaxAttempts != 3 || *r.MaxConcurrent != 1 || time.Duration(*r.Probation) != 5*time.Minute ||
		time.Duration(*r.Window) != time.Hour || time.Duration(*r.ResetTimeout) != 2*time.Minute || r.EvictAfter != nil {
		t.Errorf("defaults: %+v", r)
	}
	if want := []string{"nvidia-smi", "--gpu-reset", "-i", "{uuid}"}; !reflect.DeepEqual(r.ResetCommand, want) {
		t.Errorf("reset command %q, want %q", r.ResetCommand, want)
	}
	if r.Namespace != "gpuhealth-system" || r.PodResourcesSocket != "/var/lib/kubelet/pod-resources/kubelet.sock" {
		t.Errorf("namespace %q, socket %q", r.Namespace, r.PodResourcesSocket)
	}
}

func TestRemediationSettingsAreRead(t *testing.T) {
	c := mustParse(t, `agent: {noExecute: true}
remediation:
  enabled: true
  maxAttempts: 2
  probation: 30s
  window: 10m
  evictAfter: 1m
  resetTimeout: 20s
  resetCommand: [/opt/bin/reset-gpu, "--uuid={uuid}"]
  maxConcurrent: 4
  namespace: ops
  podResourcesSocket: "-"
`)
	r := c.Remediation.WithDefaults()
	if !r.Enabled || *r.MaxAttempts != 2 || *r.MaxConcurrent != 4 || time.Duration(*r.Probation) != 30*time.Second ||
		time.Duration(*r.Window) != 10*time.Minute || time.Duration(*r.EvictAfter) != time.Minute ||
		time.Duration(*r.ResetTimeout) != 20*time.Second || r.Namespace != "ops" || r.PodResourcesSocket != "-" {
		t.Errorf("read %+v", r)
	}
	if want := []string{"/opt/bin/reset-gpu", "--uuid={uuid}"}; !reflect.DeepEqual(r.ResetCommand, want) {
		t.Errorf("reset command %q, want %q", r.ResetCommand, want)
	}
}

func TestRemediationValidation(t *testing.T) {
	cases := []struct{ name, body, path, detail string }{
		{"zero attempts", "remediation: {maxAttempts: 0}\n", "remediation.maxAttempts", "between 1 and 100"},
		{"too many attempts", "remediation: {maxAttempts: 101}\n", "remediation.maxAttempts", "between 1 and 100"},
		{"zero concurrency", "remediation: {maxConcurrent: 0}\n", "remediation.maxConcurrent", "between 1"},
		{"short probation", "remediation: {probation: 10ms}\n", "remediation.probation", "at least 1s"},
		{"negative window", "remediation: {window: -1m}\n", "remediation.window", "at least 1s"},
		{"window shorter than probation", "remediation: {probation: 10m, window: 5m}\n", "remediation.window", "at least the probation"},
		{"short reset timeout", "remediation: {resetTimeout: 0s}\n", "remediation.resetTimeout", "at least 1s"},
		{"negative evictAfter", "agent: {noExecute: true}\nremediation: {evictAfter: -1s}\n", "remediation.evictAfter", "at least 0s"},
		{"evictAfter without noExecute", "remediation: {evictAfter: 1m}\n", "remediation.evictAfter", "agent.noExecute"},
		{"empty reset command", "remediation: {resetCommand: []}\n", "remediation.resetCommand", "program"},
		{"blank program", "remediation: {resetCommand: [\" \", \"{uuid}\"]}\n", "remediation.resetCommand", "program"},
		{"command without the GPU", "remediation: {resetCommand: [nvidia-smi, --gpu-reset]}\n", "remediation.resetCommand", "{uuid}"},
		{"validation without remediation", "remediation: {validation: {enabled: true}}\n", "remediation.validation.enabled", "remediation.enabled"},
		{"validation command without the GPU", "remediation: {enabled: true, validation: {enabled: true, command: [dcgmi, diag, -r, \"2\", -j]}}\n", "remediation.validation.command", "{index}"},
		{"empty validation command", "remediation: {validation: {command: []}}\n", "remediation.validation.command", "program"},
		{"unknown format", "remediation: {validation: {format: junit}}\n", "remediation.validation.format", "exitCode"},
		{"short validation timeout", "remediation: {validation: {timeout: 10ms}}\n", "remediation.validation.timeout", "between 1s"},
		{"endless validation timeout", "remediation: {validation: {timeout: 48h}}\n", "remediation.validation.timeout", "24h0m0s"},
		{"negative validation probation", "remediation: {validation: {probation: -1s}}\n", "remediation.validation.probation", "negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			var fes config.FieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("error %v, want field errors", err)
			}
			for _, fe := range fes {
				if fe.Path == tc.path && strings.Contains(fe.Detail, tc.detail) {
					return
				}
			}
			t.Fatalf("error %q lacks %s: ...%s...", err, tc.path, tc.detail)
		})
	}
}

func TestRemediationUnknownFieldIsAnErrorWithItsLine(t *testing.T) {
	_, err := config.Parse([]byte(header + "remediation:\n  enabled: true\n  maxAttemps: 3\n"))
	if err == nil || !strings.Contains(err.Error(), "maxAttemps") || !strings.Contains(err.Error(), "5") {
		t.Fatalf("error %v, want the unknown field and its line", err)
	}
}

func TestValidationIsOffByDefaultAndDefaults(t *testing.T) {
	c, err := config.Parse([]byte(header + "remediation:\n  enabled: true\n  probation: 3m\n"))
	if err != nil {
		t.Fatal(err)
	}
	v := c.Remediation.WithDefaults().Validation
	if v.Enabled || strings.Join(v.Command, " ") != "dcgmi diag -r 2 -i gpu:{dcgmID} -j" || v.Format != "dcgm" ||
		time.Duration(*v.Timeout) != 15*time.Minute || !*v.AfterReboot || time.Duration(*v.Probation) != 3*time.Minute {
		t.Fatalf("validation defaults: %+v (timeout %v, probation %v)", v, *v.Timeout, *v.Probation)
	}
	c, err = config.Parse([]byte(header + "remediation:\n  enabled: true\n  validation:\n    enabled: true\n    command: [/opt/dcgm/dcgmi, diag, -i, \"gpu:{index}\", -j, --host, \"{hostIP}:5555\"]\n    format: exitCode\n    timeout: 5m\n    afterReboot: false\n    probation: 0s\n"))
	if err != nil {
		t.Fatal(err)
	}
	v = c.Remediation.WithDefaults().Validation
	if !v.Enabled || v.Command[0] != "/opt/dcgm/dcgmi" || v.Format != "exitCode" || time.Duration(*v.Timeout) != 5*time.Minute || *v.AfterReboot || *v.Probation != 0 {
		t.Fatalf("validation settings: %+v", v)
	}
}
