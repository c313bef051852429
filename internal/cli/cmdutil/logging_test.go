package cmdutil

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func TestLogOptionsRunE(t *testing.T) {
	errInvalid := BadInput(errors.New("--x: wrong"))
	errRun := errors.New("ran and failed")
	tests := []struct {
		name      string
		format    string
		validate  error
		run       error
		wantSteps []string
		wantErr   error
	}{
		{"runs after validating", "text", nil, nil, []string{"validate", "run"}, nil},
		{"run's error returned", "json", nil, errRun, []string{"validate", "run"}, errRun},
		{"bad flags do not run", "text", errInvalid, nil, []string{"validate"}, errInvalid},
		{"a bad --log-format is said first", "xml", errInvalid, nil, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var steps []string
			o := &LogOptions{Format: tc.format}
			runE := o.RunE(
				func() error { steps = append(steps, "validate"); return tc.validate },
				func(ctx context.Context) error {
					steps = append(steps, "run")
					if klog.FromContext(ctx).GetSink() == nil {
						t.Error("run's context carries no logger")
					}
					return tc.run
				})
			cmd := &cobra.Command{}
			cmd.SetErr(io.Discard)
			cmd.SetContext(t.Context())
			err := runE(cmd, nil)
			if !slices.Equal(steps, tc.wantSteps) {
				t.Errorf("steps %q; want %q", steps, tc.wantSteps)
			}
			switch {
			case tc.format == "xml":
				var bad InputError
				if !errors.As(err, &bad) {
					t.Errorf("err %v; want bad input for the --log-format", err)
				}
			case !errors.Is(err, tc.wantErr):
				t.Errorf("err %v; want %v", err, tc.wantErr)
			}
		})
	}
}
