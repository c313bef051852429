package simdriver

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// A consumer that dies in the middle of nvmlEventSetWait leaves nothing behind: its event sets
// and its NVML session go with its last connection, so a later driver unload is not refused on
// its account.
func TestConsumerDiesMidCall(t *testing.T) {
	var srv *node
	dial := benchServerT(t, 4, func(n *node) { srv = n })
	c := dial()
	call := func(req request) response {
		t.Helper()
		r, err := roundTrip(c, &req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	set := call(request{Op: opEventSetCreate}).V[0]
	if r := call(request{Op: opRegisterEvents, Dev: 0, A: uint32(set), C: eventXID}); r.Ret != retSuccess {
		t.Fatalf("register: %d", r.Ret)
	}
	// The consumer blocks in a 60 s wait, and dies.
	if err := writeRequest(c, &request{Op: opEventSetWait, A: uint32(set), B: 60_000}); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		srv.mu.Lock()
		sets, holders := len(srv.sets), len(srv.holders())
		srv.mu.Unlock()
		if sets == 0 && holders == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the consumer died: %d event sets, %d holders left", sets, holders)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The driver can go now.
	srv.mu.Lock()
	err := srv.apply(driverEvent("unload"))
	srv.mu.Unlock()
	if err != nil {
		t.Errorf("unload after the consumer died: %v", err)
	}
}

// A driver root the simulator cannot write is a clear error, and nothing is served.
func TestReadOnlyDriverRoot(t *testing.T) {
	_, err := Install("/proc", "", fakeLibraryDir(t), "")
	if err == nil || !strings.Contains(err.Error(), "installing the simulated driver into /proc") {
		t.Errorf("Install(/proc) = %v, want a clear error", err)
	}
	if _, err := os.Stat("/proc/usr"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("something was left in /proc: %v", err)
	}
	if _, err := net.Dial("unix", SocketPath("/proc")); err == nil {
		t.Error("a socket answers in /proc")
	}
}
