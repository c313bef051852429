package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// slowPodsClient is a fake clientset whose reads of one pod wait for release and then honour
// their context, as a real client's do: it shows whether a request keeps its context while the
// server drains.
type slowPodsClient struct {
	*fake.Clientset
	slowPod          string
	reading, release chan struct{}
}

func (c *slowPodsClient) CoreV1() corev1client.CoreV1Interface {
	return slowCore{CoreV1Interface: c.Clientset.CoreV1(), c: c}
}

type slowCore struct {
	corev1client.CoreV1Interface
	c *slowPodsClient
}

func (s slowCore) Pods(namespace string) corev1client.PodInterface {
	return slowPods{PodInterface: s.CoreV1Interface.Pods(namespace), c: s.c}
}

type slowPods struct {
	corev1client.PodInterface
	c *slowPodsClient
}

func (p slowPods) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error) {
	if name == p.c.slowPod {
		close(p.c.reading)
		<-p.c.release
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return p.PodInterface.Get(ctx, name, opts)
}

var _ kubernetes.Interface = (*slowPodsClient)(nil)

func TestRunDrainsABindInFlight(t *testing.T) {
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	client := &slowPodsClient{
		Clientset: fake.NewClientset(node("n", 8, nil), pod("slow", "", scheduling.ResourceGPU, 1, nil)),
		slowPod:   "slow", reading: make(chan struct{}), release: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, ln, client, Options{Bind: true}) }()

	body, err := json.Marshal(extenderv1.ExtenderBindingArgs{PodName: "slow", PodNamespace: "default", Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	type reply struct {
		res extenderv1.ExtenderBindingResult
		err error
	}
	replied := make(chan reply, 1)
	go func() {
		var r reply
		defer func() { replied <- r }()
		// Run serves once the caches are filled; the request waits in the listen backlog till then.
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+ln.Addr().String()+"/bind", bytes.NewReader(body))
		if err != nil {
			r.err = err
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			r.err = err
			return
		}
		defer resp.Body.Close()
		r.err = json.NewDecoder(resp.Body).Decode(&r.res)
	}()
	<-client.reading // the bind is in flight
	cancel()
	close(client.release)
	r := <-replied
	if r.err != nil || r.res.Error != "" {
		t.Errorf("bind in flight at shutdown: %v %q, want it to finish", r.err, r.res.Error)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, ln, fake.NewClientset(node("n", 1, nil)), Options{}) }()
	url := "http://" + ln.Addr().String() + "/healthz"
	waitFor(t, func() bool {
		resp, err := http.Get(url) //nolint:noctx // a test probe
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := http.Get(url); err == nil { //nolint:noctx // a test probe
		t.Error("still serving after shutdown")
	}
}
