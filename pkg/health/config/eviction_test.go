package config_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestEvictionIsOffByDefaultAndDefaulted(t *testing.T) {
	c, err := config.Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Agent.Eviction.WithDefaults()
	if e.Enabled || e.DryRun || e.DaemonSetPods {
		t.Fatalf("eviction defaults %+v: want everything off", e)
	}
	if time.Duration(*e.GracePeriod) != 0 || time.Duration(*e.Retry) != config.DefaultEvictionRetry || e.PodResourcesSocket != config.DefaultPodResourcesSocket {
		t.Fatalf("eviction defaults %+v", e)
	}

	c, err = config.Parse([]byte(header + "agent:\n  eviction:\n    enabled: true\n    dryRun: true\n    gracePeriod: 30s\n    excludeNamespaces: [kube-system]\n    reportOnlyNamespaces: [research]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Agent.Eviction; !e.Enabled || !e.DryRun || time.Duration(*e.GracePeriod) != 30*time.Second ||
		len(e.ExcludeNamespaces) != 1 || e.ReportOnlyNamespaces[0] != "research" {
		t.Fatalf("parsed eviction %+v", e)
	}
}

func TestEvictionValidation(t *testing.T) {
	cases := []struct {
		name, body, path string
	}{
		{"negative grace period", "agent: {eviction: {gracePeriod: -1s}}\n", "agent.eviction.gracePeriod"},
		{"retry too short", "agent: {eviction: {retry: 10ms}}\n", "agent.eviction.retry"},
		{"namespace both excluded and report only", "agent: {eviction: {excludeNamespaces: [a, b], reportOnlyNamespaces: [b]}}\n", "agent.eviction.excludeNamespaces[1]"},
		{"unknown field", "agent: {eviction: {evictEverything: true}}\n", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			if err == nil {
				t.Fatal("no error")
			}
			if tc.path == "" {
				return
			}
			var fes config.FieldErrors
			var fe *config.FieldError
			found := false
			if errors.As(err, &fes) {
				for _, e := range fes {
					found = found || e.Path == tc.path
				}
			} else if errors.As(err, &fe) {
				found = fe.Path == tc.path
			}
			if !found {
				t.Fatalf("error %v does not name %s", err, tc.path)
			}
		})
	}
}
