package validation

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseFormat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Format
		wantErr string
	}{
		{name: "empty is dcgm", in: "", want: FormatDCGM},
		{name: "dcgm", in: "dcgm", want: FormatDCGM},
		{name: "exitCode", in: "exitCode", want: FormatExitCode},
		{name: "case matters", in: "DCGM", wantErr: `unknown validation format "DCGM" (want "dcgm" or "exitCode")`},
		{name: "unknown", in: "healthValidation", wantErr: `"dcgm" or "exitCode"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFormat(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseFormat(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseFormat(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestReadExitCode(t *testing.T) {
	long := strings.Repeat("x", 3000) + "\xff"
	tests := []struct {
		name   string
		output string
		exit   int
		want   Result
		msg    string // substring of Message
	}{
		{name: "zero passes", output: "all good\n", exit: 0, want: Passed, msg: "exited 0: all good"},
		{name: "zero without output", exit: 0, want: Passed, msg: "exited 0"},
		{name: "one fails with the output", output: "  GPU 2: memory test failed\n\n", exit: 1, want: Failed, msg: "exited 1: GPU 2: memory test failed"},
		{name: "any other code fails", output: "", exit: 42, want: Failed, msg: "exited 42"},
		{name: "negative is an error", output: "partial", exit: -1, want: Error, msg: "did not exit normally"},
		{name: "long invalid output is clipped to valid UTF-8", output: long, exit: 2, want: Failed, msg: "exited 2: xxx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := ReadExitCode([]byte(tc.output), tc.exit)
			if v.Result != tc.want || !strings.Contains(v.Message, tc.msg) {
				t.Fatalf("ReadExitCode = %q %q, want %q containing %q", v.Result, v.Message, tc.want, tc.msg)
			}
			if len(v.Message) > maxMessage || !utf8.ValidString(v.Message) {
				t.Errorf("Message is %d bytes or not valid UTF-8", len(v.Message))
			}
		})
	}
}

func TestRead(t *testing.T) {
	doc := fixture(t, "dcgm4-pass.json")
	tests := []struct {
		name   string
		format Format
		out    []byte
		exit   int
		want   Result
	}{
		{name: "empty format reads DCGM", format: "", out: doc, exit: 0, want: Passed},
		{name: "dcgm", format: FormatDCGM, out: []byte("not json"), exit: 0, want: Error},
		{name: "exitCode ignores the document", format: FormatExitCode, out: doc, exit: 3, want: Failed},
		{name: "unknown format is an error", format: "junit", out: doc, exit: 0, want: Error},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if v := Read(tc.format, tc.out, tc.exit, Target{DCGMID: 2}); v.Result != tc.want {
				t.Fatalf("Read = %q (%s), want %q", v.Result, v.Message, tc.want)
			}
		})
	}
}

func TestClip(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int
		want string
	}{
		{name: "short stays", in: "abc", n: 5, want: "abc"},
		{name: "cut marks", in: "abcdefgh", n: 6, want: "abc..."},
		{name: "never splits a rune", in: "aéééé", n: 7, want: "aé..."},
		{name: "invalid bytes replaced", in: "a\xffb", n: 10, want: "a\uFFFDb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := clip(tc.in, tc.n); got != tc.want {
				t.Fatalf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
		})
	}
}
