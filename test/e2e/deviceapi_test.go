//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/deviceapitest"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// When the scenario of TestDeviceAPI breaks GPU 1 (and warms GPU 2), and when it resets GPU 1:
// long enough after the agent starts for the test to have opened its watches and its bad
// clients first, on a slow machine too.
const (
	deviceAPIFaultAt  = 20 * time.Second
	deviceAPIRepairAt = 30 * time.Second
)

// TestDeviceAPI runs the real agent with the Device API on a socket: ListGpus lists every GPU;
// a WatchGpus client that was waiting for the socket sees every GPU, then GPU 1 go NotReady with
// XID 48 and Ready again after its reset, GPU 2 stay Ready though Degraded, each change once;
// meanwhile clients that never read, a connection that never speaks gRPC and more watches than
// allowed (refused) slow neither the watch that reads nor the agent's reports on the Node. The
// socket is the agent user's alone, and gone when the agent stops.
func TestDeviceAPI(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "deviceapi-node"
	uuids := gpuNode(t, c, node, 4)
	socket := filepath.Join(t.TempDir(), "device-api.sock")

	// The watch is open before the agent starts: the client waits for the socket.
	watch := watchDeviceAPI(t, deviceapitest.Dial(t, socket))
	agent := startAgent(t, agentSetup{
		node: node, gpus: 4, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: fmt.Sprintf("events:\n  - {at: %s, gpu: 1, xid: 48}\n  - {at: %s, gpu: 2, temperatureC: 92}\n  - {at: %s, gpu: 1, reset: true}\n",
			deviceAPIFaultAt, deviceAPIFaultAt, deviceAPIRepairAt),
		agentConfig: fmt.Sprintf("  deviceAPI: {socket: %s, maxWatchers: 4}\n", socket),
	})
	name := func(i int) string { return strings.ToLower(uuids[i]) }
	healthy := func(i int) string { return name(i) + " Ready=True/Healthy" }

	for i := range uuids {
		if got, want := watch.next(t), "ADDED "+healthy(i); got != want {
			t.Fatalf("initial event %d: %s, want %s", i, got, want)
		}
	}
	if st, err := os.Lstat(socket); err != nil || st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("the socket: %v %v, want a socket of mode 0600", st, err)
	}
	ctx := t.Context()
	list, err := deviceapitest.Dial(t, socket).ListGpus(ctx, &v1alpha1.ListGpusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, g := range list.GetGpuList().GetItems() {
		listed = append(listed, g.GetSpec().GetUuid()+" "+deviceapitest.Describe(g))
	}
	var want []string
	for i, u := range uuids {
		want = append(want, u+" "+healthy(i))
	}
	if !slices.Equal(listed, want) {
		t.Fatalf("ListGpus:\n  %s\nwant every GPU:\n  %s", strings.Join(listed, "\n  "), strings.Join(want, "\n  "))
	}

	// Bad clients: three watches whose client reads one event (so each is known to hold its
	// place) and then never reads again, a connection that never speaks gRPC, and a fifth watch,
	// refused, since four are open.
	stuck := deviceapitest.Dial(t, socket, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	for i := range 3 {
		w, err := stuck.WatchGpus(ctx, &v1alpha1.WatchGpusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stuck watch %d: %v", i, err)
		}
	}
	mute, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mute.Close() })
	extra, err := deviceapitest.Dial(t, socket).WatchGpus(ctx, &v1alpha1.WatchGpusRequest{})
	if err == nil {
		_, err = extra.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "4 watches are open") {
		t.Fatalf("a watch beyond agent.deviceAPI.maxWatchers: %v, want ResourceExhausted: 4 watches are open", err)
	}

	// The fault, seen by the watch that reads and reported on the Node, bad clients or not.
	faulty := "MODIFIED " + name(1) + " Ready=False/XID48 XIDHealthy=False/XID48 action=ResetGPU"
	warm := "MODIFIED " + name(2) + " Ready=True/TemperatureAtSlowdown ThermalHealthy=False/TemperatureAtSlowdown action=CheckCooling"
	got := []string{watch.nextWithin(t, deviceAPIFaultAt+pollTimeout), watch.next(t)}
	slices.Sort(got)
	if want := []string{faulty, warm}; !slices.Equal(got, want) {
		t.Fatalf("at the fault the watch got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	eventually(t, "GPU 1 Unhealthy on the Node", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		return err == nil && ann[gpuhealthv1.UnhealthyIDsKey] == "1", ann[gpuhealthv1.UnhealthyIDsKey], err
	})
	get, err := deviceapitest.Dial(t, socket).GetGpu(ctx, &v1alpha1.GetGpuRequest{Name: uuids[1]})
	if err != nil {
		t.Fatal(err)
	}
	ready := get.GetGpu().GetStatus().GetConditions()[0]
	if ready.GetType() != deviceapi.TypeReady || !strings.Contains(ready.GetMessage(), "XID 48") || ready.GetLastTransitionTime() == nil {
		t.Errorf("GPU 1's Ready: %v", ready)
	}

	// The reset: Ready again, once; nothing else changed in between.
	if got, want := watch.nextWithin(t, deviceAPIRepairAt+pollTimeout), "MODIFIED "+healthy(1); got != want {
		t.Fatalf("after GPU 1's reset the watch got %s, want %s", got, want)
	}

	agent.stop()
	if _, err := watch.recv(t); status.Code(err) != codes.Unavailable {
		t.Errorf("the watch when the agent stops: %v, want UNAVAILABLE (and no further change)", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is still there after the agent stopped: %v", err)
	}
}

// deviceAPIWatch receives a watch's events on a goroutine of its own, so that the test can wait
// for each with a timeout.
type deviceAPIWatch struct {
	events chan *v1alpha1.WatchGpusResponse
	err    chan error
}

// watchDeviceAPI opens a watch, which waits for the socket, and receives until it ends.
func watchDeviceAPI(t *testing.T, client v1alpha1.GpuServiceClient) *deviceAPIWatch {
	t.Helper()
	w := &deviceAPIWatch{events: make(chan *v1alpha1.WatchGpusResponse, 64), err: make(chan error, 1)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		stream, err := client.WatchGpus(ctx, &v1alpha1.WatchGpusRequest{})
		for err == nil {
			var ev *v1alpha1.WatchGpusResponse
			if ev, err = stream.Recv(); err == nil {
				select {
				case w.events <- ev:
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
		}
		w.err <- err
	}()
	return w
}

// recv returns the next event, or the error the watch ended with.
func (w *deviceAPIWatch) recv(t *testing.T) (*v1alpha1.WatchGpusResponse, error) {
	t.Helper()
	select {
	case ev := <-w.events:
		return ev, nil
	case err := <-w.err:
		w.err <- err
		return nil, err
	case <-time.After(pollTimeout):
		t.Fatalf("no event within %v", pollTimeout)
		return nil, nil
	}
}

func (w *deviceAPIWatch) next(t *testing.T) string {
	t.Helper()
	return w.nextWithin(t, pollTimeout)
}

// nextWithin describes the next event, received within d, as "TYPE name Ready=... action=...".
func (w *deviceAPIWatch) nextWithin(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case ev := <-w.events:
		return ev.GetType() + " " + deviceapitest.Describe(ev.GetObject())
	case err := <-w.err:
		t.Fatalf("the watch ended: %v", err)
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	return ""
}
