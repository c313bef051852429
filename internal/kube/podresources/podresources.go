// Package podresources asks the kubelet's pod-resources API (v1, a gRPC service on a node-local
// Unix socket) which pods hold which devices: the one reader of that socket, shared by the
// evictor (which pods to move off a sick GPU) and remediation (which pods still hold a GPU it
// wants to reset).
package podresources

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultTimeout bounds one List when Socket.Timeout is not set.
const DefaultTimeout = 10 * time.Second

// Socket dials the kubelet's pod-resources socket for each List: a kubelet restart (which
// makes the socket anew) costs nothing to a caller that holds a Socket.
type Socket struct {
	// Path is the socket, as the kubelet serves it (/var/lib/kubelet/pod-resources/kubelet.sock).
	Path string
	// Timeout bounds one List (default DefaultTimeout).
	Timeout time.Duration
}

// List returns every pod's devices as the kubelet allocated them. A socket that is not there
// is an error that errors.Is takes for fs.ErrNotExist: no kubelet serves it at that path (or
// the path is not mounted), which a caller may tell from a kubelet that does not answer.
func (s Socket) List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	if _, err := os.Stat(s.Path); err != nil {
		return nil, fmt.Errorf("kubelet pod-resources: %w", err)
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+s.Path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources %s: %w", s.Path, err)
	}
	defer conn.Close()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources %s: List: %w", s.Path, err)
	}
	return resp, nil
}
