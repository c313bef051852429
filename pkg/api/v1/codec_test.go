package v1

import (
	"testing"
	"time"
)

func TestFormatDrains(t *testing.T) {
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		drains map[string]Drain
		want   string
	}{
		{name: "none", drains: nil, want: ""},
		{name: "empty", drains: map[string]Drain{}, want: ""},
		{
			name:   "one",
			drains: map[string]Drain{"GPU-a": {Index: 3, Reason: "fan noise", By: "bob", At: at}},
			want:   `{"GPU-a":{"index":3,"reason":"fan noise","by":"bob","at":"2026-11-30T10:00:00Z"}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatDrains(tc.drains)
			if err != nil || got != tc.want {
				t.Fatalf("FormatDrains() = %q, %v; want %q", got, err, tc.want)
			}
			back, err := ParseDrains(got)
			if err != nil || len(back) != len(tc.drains) {
				t.Fatalf("ParseDrains(FormatDrains()) = %v, %v; want the %d drains back", back, err, len(tc.drains))
			}
			for uuid, d := range tc.drains {
				if back[uuid] != d {
					t.Errorf("drain %s came back as %+v; want %+v", uuid, back[uuid], d)
				}
			}
		})
	}
}
