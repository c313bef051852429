package deviceapi_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
)

// listen is deviceapi.Listen that fails the test on an error; the listener is closed when the
// test ends.
func listen(t *testing.T, o deviceapi.SocketOptions) net.Listener {
	t.Helper()
	lis, err := deviceapi.Listen(o)
	if err != nil {
		t.Fatalf("Listen(%+v): %v", o, err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	return lis
}

// socketFile returns the mode and group of the socket at path, failing the test if it is no
// socket.
func socketFile(t *testing.T, path string) (fs.FileMode, uint32) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != fs.ModeSocket {
		t.Fatalf("%s is %v, not a socket", path, st.Mode())
	}
	return st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid
}

func TestSocketModeAndGroup(t *testing.T) {
	// Listen sets the mode whatever the umask: with none, net.Listen would make 0777.
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	gid := os.Getgid()
	name := strconv.Itoa(gid)
	if g, err := user.LookupGroupId(name); err == nil {
		name = g.Name
	}
	for _, tc := range []struct {
		what, group string
		mode        fs.FileMode
		gid         int
	}{
		{"no group: the server's user alone", "", 0o600, gid},
		{"a GID: the group too", strconv.Itoa(gid), 0o660, gid},
		{"a group name", name, 0o660, gid},
	} {
		t.Run(tc.what, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "sub", "device-api.sock")
			lis := listen(t, deviceapi.SocketOptions{Path: path, Group: tc.group})
			if mode, g := socketFile(t, path); mode != tc.mode || int(g) != tc.gid {
				t.Errorf("socket mode %v group %d, want %v %d", mode, g, tc.mode, tc.gid)
			}
			if lis.Addr().String() != path {
				t.Errorf("Addr() = %s, want %s", lis.Addr(), path)
			}
			// Nothing is left of the private directory the socket was made in.
			if entries, err := os.ReadDir(filepath.Dir(path)); err != nil || len(entries) != 1 {
				t.Errorf("the socket's directory holds %v (%v), want the socket alone", entries, err)
			}
			// It accepts connections at its final path.
			conn, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			_ = conn.Close()
		})
	}
	if _, err := deviceapi.Listen(deviceapi.SocketOptions{Path: filepath.Join(t.TempDir(), "s.sock"), Group: "no-such-group-here"}); err == nil {
		t.Error("Listen with a group that does not exist succeeded")
	}
}

func TestSocketReplacesAStaleOneAndRemovesOnlyItsOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device-api.sock")
	// A socket a killed server left behind.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()

	first, err := deviceapi.Listen(deviceapi.SocketOptions{Path: path})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	// A second server takes the path over; the first one's Close must leave its socket.
	second := listen(t, deviceapi.SocketOptions{Path: path})
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	socketFile(t, path)
	accepted := make(chan error, 1)
	go func() {
		conn, err := second.Accept()
		if err == nil {
			_ = conn.Close()
		}
		accepted <- err
	}()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the second server's socket: %v", err)
	}
	_ = conn.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the second server did not get the connection: %v", err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is still there after its server closed it: %v", err)
	}
}

func TestSocketRefusesToReplaceAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device-api.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	if lis, err := deviceapi.Listen(deviceapi.SocketOptions{Path: path}); err == nil {
		_ = lis.Close()
		t.Fatal("Listen replaced a regular file")
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a socket" {
		t.Errorf("the file was changed: %q %v", b, err)
	}
}
