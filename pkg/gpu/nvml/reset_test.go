package nvml_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// fakeResetCommand writes an executable that records its arguments and exits with code, saying
// msg on stderr.
func fakeResetCommand(t *testing.T, code int, msg string) (path, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	path, argsFile = filepath.Join(dir, "fake-nvidia-smi"), filepath.Join(dir, "args")
	script := "#!/bin/sh\necho \"$@\" >> " + argsFile + "\necho '" + msg + "' >&2\nexit " + string(rune('0'+code)) + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, argsFile
}

func TestCommandResetterRunsTheCommandAndReportsTheReset(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 40, 2 })
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	cmd, argsFile := fakeResetCommand(t, 0, "GPU reset successfully")
	r, err := b.CommandResetter([]string{cmd, "--gpu-reset", "-i", "{uuid}"})
	if err != nil {
		t.Fatal(err)
	}
	rec.Take()
	if err := r.Reset(t.Context(), f.uuid(1)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := "--gpu-reset -i " + f.uuid(1) + "\n"; string(got) != want {
		t.Fatalf("command got %q, want %q", got, want)
	}
	f.step(b)
	sigs := rec.Take()
	if kinds := kindsOf(sigs, f.uuid(1)); len(kinds) == 0 || kinds[0] != health.SignalReset {
		t.Fatalf("GPU 1 signals %v, want the reset first", kinds)
	}
	if slices.Contains(kindsOf(sigs, f.uuid(0)), health.SignalReset) {
		t.Fatal("GPU 0 reported reset too")
	}
	f.step(b)
	if slices.Contains(kindsOf(rec.Take(), f.uuid(1)), health.SignalReset) {
		t.Fatal("the reset was reported twice")
	}
}

func TestCommandResetterFailures(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	cmd, argsFile := fakeResetCommand(t, 3, "Unable to reset GPU: in use by another client")
	r, err := b.CommandResetter([]string{cmd, "-r", "{uuid}"})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Reset(t.Context(), f.uuid(0))
	if err == nil || !strings.Contains(err.Error(), "in use by another client") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("error %v, want the command's exit status and message", err)
	}
	if err := r.Reset(t.Context(), "GPU-not-here"); err == nil || !strings.Contains(err.Error(), "not a GPU of this node") {
		t.Fatalf("unknown GPU: %v", err)
	}
	if got, _ := os.ReadFile(argsFile); strings.Count(string(got), "\n") != 1 {
		t.Fatalf("command ran %q, want once (not for the unknown GPU)", got)
	}
	missing, _ := b.CommandResetter([]string{filepath.Join(t.TempDir(), "no-such-tool"), "{uuid}"})
	if err := missing.Reset(t.Context(), f.uuid(0)); err == nil {
		t.Fatal("a missing command succeeded")
	}
	f.step(b)
	if slices.Contains(kindsOf(rec.Take(), f.uuid(0)), health.SignalReset) {
		t.Fatal("a failed reset was reported as a reset")
	}
	if _, err := b.CommandResetter(nil); err == nil {
		t.Fatal("an empty command was accepted")
	}
}
