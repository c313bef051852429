package v1

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestParseClears(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        int // requests
		wantErr     string
	}{
		{"empty", "", 0, ""},
		{"blank", "  ", 0, ""},
		{"one GPU, two requests", `{"GPU-a":[{"index":0,"condition":"XID79","reason":"loose cable","by":"alice","at":"2026-11-30T10:00:00Z"},{"index":0,"reason":"all of it","by":"alice","at":"2026-11-30T10:00:00Z"}]}`, 2, ""},
		{"two GPUs", `{"GPU-a":[{"condition":"XID:79","reason":"r","at":"2026-11-30T10:00:00Z"}],"GPU-b":[{"condition":"nvlinkdown:3","reason":"r","at":"2026-11-30T10:00:00Z"}]}`, 2, ""},
		{"no at", `{"GPU-a":[{"condition":"XID79","reason":"r","by":"alice"}]}`, 0, `GPU-a[0]: no "at"`},
		{"not JSON", `{"GPU-a":`, 0, ClearsKey},
		{"a list of the wrong shape", `{"GPU-a":{"reason":"r"}}`, 0, ClearsKey},
		{"empty UUID", `{"":[{"reason":"r"}]}`, 0, "empty UUID"},
		{"no reason", `{"GPU-a":[{"condition":"XID79","reason":" "}]}`, 0, "GPU-a[0]: no reason"},
		{"a bad condition makes the whole value bad", `{"GPU-a":[{"reason":"r","at":"2026-11-30T10:00:00Z"}],"GPU-b":[{"condition":"XID 79","reason":"r","at":"2026-11-30T10:00:00Z"}]}`, 0, "GPU-b[0]"},
		{"a drain is not cleared", `{"GPU-a":[{"condition":"AdminDrain","reason":"r"}]}`, 0, "undrain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseClears(tc.value)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseClears(%s) = %v, %v; want an error containing %q", tc.value, got, err, tc.wantErr)
				}
				return
			}
			n := 0
			for _, l := range got {
				n += len(l)
			}
			if err != nil || n != tc.want {
				t.Fatalf("ParseClears(%s) = %v, %v; want %d requests", tc.value, got, err, tc.want)
			}
		})
	}
}

func TestFormatClearsRoundTrips(t *testing.T) {
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	in := map[string][]Clear{"GPU-a": {{Index: 1, Condition: "XID79", Reason: "loose cable", By: "alice", At: at}}}
	value, err := FormatClears(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseClears(value)
	if err != nil || len(out["GPU-a"]) != 1 || out["GPU-a"][0] != in["GPU-a"][0] {
		t.Fatalf("round trip of %s = %+v, %v", value, out, err)
	}
	if empty, err := FormatClears(map[string][]Clear{"GPU-a": nil}); empty != "" || err != nil {
		t.Errorf("no requests format as %q, %v; want \"\" (the annotation removed)", empty, err)
	}
	if got, want := in["GPU-a"][0].Message(), "by alice at 2026-11-30T10:00:00Z: loose cable"; got != want {
		t.Errorf("Message() = %q, want %q", got, want)
	}
	if got := (Clear{Reason: "r"}).Message(); got != "by unknown: r" {
		t.Errorf("Message() without by or at = %q", got)
	}
}

func TestConditionSelector(t *testing.T) {
	xid79 := health.Condition{Type: health.ConditionXID, Code: 79, Reason: "XID79"}
	xid48 := health.Condition{Type: health.ConditionXID, Code: 48, Reason: "XID48"}
	ecc := health.Condition{Type: health.ConditionECCUncorrected, Reason: "UncorrectedECCErrors"}
	link3 := health.Condition{Type: health.ConditionNVLinkDown, Code: 3, Reason: "NVLinkDown"}
	link5 := health.Condition{Type: health.ConditionNVLinkDown, Code: 5, Reason: "NVLinkDown"}
	drain := health.Condition{Type: health.ConditionAdmin, Reason: health.ReasonAdminDrain}
	all := []health.Condition{xid79, xid48, ecc, link3, link5, drain}
	for _, tc := range []struct {
		text string
		want []health.Condition
	}{
		{"", []health.Condition{xid79, xid48, ecc, link3, link5}}, // everything but the drain
		{"XID79", []health.Condition{xid79}},                      // a reason, as status shows it
		{"xid79", []health.Condition{xid79}},                      // in any case
		{"UncorrectedECCErrors", []health.Condition{ecc}},
		{"ECCUncorrected", []health.Condition{ecc}}, // its type
		{"XID", []health.Condition{xid79, xid48}},   // every XID
		{"XID:48", []health.Condition{xid48}},
		{"NVLinkDown", []health.Condition{link3, link5}}, // the reason of every link
		{"NVLinkDown:5", []health.Condition{link5}},      // one link
		{"XID:80", nil},
		{"Thermal", nil},
	} {
		t.Run(tc.text, func(t *testing.T) {
			sel, err := ParseConditionSelector(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.EqualFold(sel.String(), tc.text) {
				t.Errorf("String() = %q, want %q", sel.String(), tc.text)
			}
			var got []health.Condition
			for _, c := range all {
				if sel.Matches(c) {
					got = append(got, c)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%q selects %v, want %v", tc.text, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%q selects %v, want %v", tc.text, got, tc.want)
				}
			}
		})
	}
	for _, bad := range []string{"XID 79", "XID:", ":79", "XID:-1", "XID:0x4f", "XID:99999999999", "AdminDrain", "admin", "Admin:0", "XID\t79", strings.Repeat("X", 200)} {
		if sel, err := ParseConditionSelector(bad); err == nil {
			t.Errorf("ParseConditionSelector(%q) = %+v, want an error", bad, sel)
		}
	}
}
