package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// FuzzParse feeds arbitrary bytes to the HealthConfig parser. It must never panic; a rejection is
// one non-empty line; whatever it accepts validates, builds a policy, and survives a round trip
// through YAML unchanged in meaning.
func FuzzParse(f *testing.F) {
	if example, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "healthconfig.yaml")); err == nil {
		f.Add(example)
	}
	for _, s := range []string{
		"",
		header,
		header + "profile: device-plugin\n",
		header + "sampleInterval: 1s\nquietPeriod: 5m\n",
		header + "xids:\n  unknown: {severity: Degraded}\n  overrides:\n  - {xids: [13, 48], severity: Healthy, clearsOn: admin, evict: true, recommendedAction: x}\n",
		header + "checks:\n  thermal: {slowdownC: 80, shutdownC: 85, recoverySamples: 2}\n  clockEvents: {reasons: [hwSlowdown]}\n",
		header + "checks: {pcieReplays: {perMinute: .inf}, nvlink: {errorsPerMinute: 1e-9}}\n",
		header + "checks: {ecc: {enabled: false, correctedStormPerMinute: .nan}}\n",
		header + "unknown: 1\n",
		header + "---\n" + header,
		"apiVersion: [1]\n",
		header + "xids: {overrides: [{xids: [-1]}]}\n",
		header + "sampleInterval: !!binary aGVsbG8=\n",
		"a: &a [*a]\n",
		header + "profile: !custom \"a\\nb\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := config.Parse(data)
		if err != nil {
			if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("error %q is not one non-empty line", msg)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that does not validate: %v", err)
		}
		p, err := c.Policy()
		if err != nil {
			t.Fatalf("Policy() of a valid config: %v", err)
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		c2, err := config.Parse(out)
		if err != nil {
			t.Fatalf("re-parse of\n%s: %v", out, err)
		}
		p2, err := c2.Policy()
		if err != nil {
			t.Fatal(err)
		}
		if a, b := policyString(p), policyString(p2); a != b {
			t.Fatalf("round trip changed the policy:\n%s\n%s", a, b)
		}
	})
}
