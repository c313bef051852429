package cmdutil

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestExecute(t *testing.T) {
	tests := []struct {
		name string
		run  func() error
		args []string
		code int
		want string
	}{
		{"success", func() error { return nil }, nil, ExitOK, ""},
		{"an error, on one line", func() error { return errors.New("two\nlines") }, nil, ExitFailure, "gpuhealth: two; lines\n"},
		{"bad input, wrapped", func() error { return errorsJoin(BadInput(errors.New("--x: wrong"))) }, nil, ExitBadInput, "--x: wrong"},
		{"a panic", func() error { panic("bug") }, nil, ExitFailure, "internal error: bug"},
		{"an unknown flag", func() error { return nil }, []string{"--bogus"}, ExitBadInput, "unknown flag: --bogus"},
		{"an argument", func() error { return nil }, []string{"extra"}, ExitBadInput, `unknown command "extra"`},
		{"a tool's own exit status, nothing printed", func() error { return ExitStatus{Code: 205} }, nil, 205, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := &cobra.Command{Use: "x", Args: cobra.NoArgs, SilenceUsage: true, SilenceErrors: true,
				RunE: func(*cobra.Command, []string) error { return tc.run() }}
			MarkUsageErrors(root)
			var stderr bytes.Buffer
			if code := Execute(t.Context(), root, tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) || (tc.want == "") != (stderr.Len() == 0) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

func errorsJoin(err error) error { return errors.Join(errors.New("context"), err) }
