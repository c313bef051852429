package kmsg

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Record formats follow the kernel's Documentation/ABI/testing/dev-kmsg.
func TestParseRecord(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Record
	}{
		{
			name: "kernel error with NVRM XID",
			line: "3,1042,4909922970,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n",
			want: Record{Facility: FacilityKernel, Level: LevelErr, Seq: 1042, Since: 4909922970 * time.Microsecond, Flags: "-",
				Message: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."},
		},
		{
			name: "dictionary lines belong to the record",
			line: "6,339,5140900,-;NET: Registered protocol family 10\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
			want: Record{Facility: FacilityKernel, Level: LevelInfo, Seq: 339, Since: 5140900 * time.Microsecond, Flags: "-",
				Message: "NET: Registered protocol family 10", Dict: map[string]string{"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}},
		},
		{
			name: "escaped bytes in message and dictionary",
			line: `4,7,0,-;a\x0ab \x5cx41 caf\xc3\xa9 \x7f` + "\n" + ` NOTE=tab\x09end`,
			want: Record{Facility: FacilityKernel, Level: LevelWarning, Seq: 7, Flags: "-",
				Message: "a\nb \\x41 café \x7f", Dict: map[string]string{"NOTE": "tab\tend"}},
		},
		{
			name: "backslash without a valid escape is kept",
			line: `6,8,1,-;C:\path \xZZ \x4`,
			want: Record{Facility: FacilityKernel, Level: LevelInfo, Seq: 8, Since: time.Microsecond, Flags: "-", Message: `C:\path \xZZ \x4`},
		},
		{
			name: "user facility from a process writing /dev/kmsg",
			line: "12,400,99,-;systemd[1]: Started nvidia-persistenced.",
			want: Record{Facility: FacilityUser, Level: LevelWarning, Seq: 400, Since: 99 * time.Microsecond, Flags: "-", Message: "systemd[1]: Started nvidia-persistenced."},
		},
		{
			name: "local7 debug",
			line: "191,1,0,-;x",
			want: Record{Facility: 23, Level: LevelDebug, Seq: 1, Flags: "-", Message: "x"},
		},
		{
			name: "extra prefix fields from newer kernels are ignored, semicolons in message kept",
			line: "0,18446744073709551615,1,c,caller=T1;panic; really",
			want: Record{Facility: FacilityKernel, Level: LevelEmerg, Seq: 18446744073709551615, Since: time.Microsecond, Flags: "c", Message: "panic; really"},
		},
		{
			name: "empty message",
			line: "6,2,3,-;",
			want: Record{Facility: FacilityKernel, Level: LevelInfo, Seq: 2, Since: 3 * time.Microsecond, Flags: "-"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRecord(tc.line)
			if err != nil {
				t.Fatalf("ParseRecord(%q): %v", tc.line, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseRecord(%q)\n got %#v\nwant %#v", tc.line, got, tc.want)
			}
			again, err := ParseRecord(got.String())
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("round trip through %q = %#v, %v", got.String(), again, err)
			}
		})
	}
}

func TestParseRecordMalformed(t *testing.T) {
	tests := []struct {
		name, line, wantErr string
	}{
		{"empty", "", "no ';'"},
		{"no separator", "6,1,2,-", "no ';'"},
		{"too few fields", "6,1,2;msg", "at least 4"},
		{"priority not a number", "x,1,2,-;msg", "priority"},
		{"negative priority", "-1,1,2,-;msg", "priority"},
		{"priority too large", "2048,1,2,-;msg", "priority"},
		{"sequence not a number", "6,one,2,-;msg", "sequence number"},
		{"sequence overflows", "6,18446744073709551616,2,-;msg", "sequence number"},
		{"timestamp not a number", "6,1,2.5,-;msg", "timestamp"},
		{"timestamp overflows a Duration", "6,1,9223372036854776,-;msg", "timestamp"},
		{"empty flags", "6,1,2,;msg", "flags"},
		{"continuation without leading space", "6,1,2,-;msg\nSUBSYSTEM=pci", "not a dictionary line"},
		{"dictionary line without =", "6,1,2,-;msg\n SUBSYSTEM", "not KEY=value"},
		{"dictionary line with empty key", "6,1,2,-;msg\n =pci", "not KEY=value"},
		{"blank line inside", "6,1,2,-;msg\n\n SUBSYSTEM=pci", "not a dictionary line"},
		{"syslog text", "Dec  1 09:00:00 node kernel: NVRM: Xid (PCI:0000:3b:00): 79", "no ';'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRecord(tc.line)
			if err == nil {
				t.Fatalf("ParseRecord(%q) = %#v, want an error", tc.line, r)
			}
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRecord(%q) error = %q, want ErrMalformed mentioning %q", tc.line, err, tc.wantErr)
			}
		})
	}
}

func FuzzParseRecord(f *testing.F) {
	for _, seed := range []string{
		"3,1042,4909922970,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n",
		"6,339,5140900,-;NET: Registered protocol family 10\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
		`4,7,0,-;a\x0ab \x5c caf\xc3\xa9`,
		"0,1,1,c,caller=T1;x",
		"garbage",
		"6,1,2,-;msg\nSUBSYSTEM=pci",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseRecord(line)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseRecord(%q) error %v does not wrap ErrMalformed", line, err)
			}
			return
		}
		if !strings.Contains(line, ";") {
			t.Fatalf("ParseRecord(%q) = %#v without a ';' in the input", line, r)
		}
		again, err := ParseRecord(r.String())
		if err != nil {
			t.Fatalf("ParseRecord(%q) of re-formatted %#v: %v", r.String(), r, err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip changed the record:\n got %#v\nwant %#v", again, r)
		}
		// The NVRM parser runs on every message a reader sees; it must not panic either.
		ParseNVRM(r.Message)
	})
}
