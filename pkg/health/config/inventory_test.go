package config_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestInventoryOtherDrivers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		missing bool
		wantErr string
	}{
		{name: "left out by default", body: "inventory: {sysfsRoot: /host/sys}\n"},
		{name: "left out", body: "inventory: {otherDrivers: leaveOut}\n"},
		{name: "counted missing", body: "inventory: {otherDrivers: missing}\n", missing: true},
		{name: "anything else", body: "inventory: {otherDrivers: ignore}\n", wantErr: `inventory.otherDrivers: must be leaveOut or missing, got "ignore"`},
		{name: "case matters", body: "inventory: {otherDrivers: Missing}\n", wantErr: `inventory.otherDrivers: must be leaveOut or missing, got "Missing"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(header + tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Inventory.OtherDriversMissingOn(); got != tc.missing {
				t.Errorf("OtherDriversMissingOn = %t, want %t", got, tc.missing)
			}
		})
	}
}
