//go:build e2e

package fleet

import (
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// profileWave, with GPUHEALTH_FLEET_PROFILE=DIR, profiles one wave: the test process (the agents
// or the bare clients, and the test's watches) from now until the returned function is called,
// into DIR/NAME.test.pprof, and the kube-apiserver for GPUHEALTH_FLEET_PROFILE_SECONDS (default
// 20) from now, into DIR/NAME.apiserver.pprof. Without the knob it does nothing. It is how one
// finds where a wave's time goes (go tool pprof -top).
func profileWave(t *testing.T, admin kubernetes.Interface, name string) (stop func()) {
	t.Helper()
	dir := os.Getenv("GPUHEALTH_FLEET_PROFILE")
	if dir == "" {
		return func() {}
	}
	seconds := 20
	if v := os.Getenv("GPUHEALTH_FLEET_PROFILE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPUHEALTH_FLEET_PROFILE_SECONDS=%q: want a whole number of seconds, at least 1", v)
		}
		seconds = n
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name+".test.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	apiserverDone := make(chan struct{})
	go func() {
		defer close(apiserverDone)
		raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).Timeout(time.Duration(seconds+30) * time.Second).DoRaw(t.Context())
		if err != nil {
			t.Logf("kube-apiserver's profile: %v", err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name+".apiserver.pprof"), raw, 0o644); err != nil {
			t.Logf("kube-apiserver's profile: %v", err)
		}
	}()
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			t.Errorf("profile: %v", err)
		}
		<-apiserverDone
	}
}
