// Package deviceapitest helps the tests of Device API servers and clients: Dial connects to a
// server's socket, Describe says what a Gpu says on one line, for comparisons that read like the
// docs' table.
package deviceapitest

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
)

// Describe returns the Gpu's name, its Ready condition, every family condition that is not True
// with reason Healthy, and its recommended action when it has one:
//
//	gpu-… Ready=False/XID48 XIDHealthy=False/XID48 action=ResetGPU
func Describe(g *v1alpha1.Gpu) string {
	parts := []string{g.GetName()}
	for _, c := range g.GetStatus().GetConditions() {
		if c.GetType() == deviceapi.TypeReady || c.GetStatus() != deviceapi.StatusTrue || c.GetReason() != deviceapi.ReasonHealthy {
			parts = append(parts, fmt.Sprintf("%s=%s/%s", c.GetType(), c.GetStatus(), c.GetReason()))
		}
	}
	if a := g.GetStatus().GetRecommendedAction(); a != "" {
		parts = append(parts, "action="+a)
	}
	return strings.Join(parts, " ")
}

// Dial returns a client of the Device API on the Unix socket at path, closed when the test ends.
// Its calls wait for the socket (gRPC's WaitForReady): a server may still be creating it. opts
// come after the defaults.
func Dial(t testing.TB, path string, opts ...grpc.DialOption) v1alpha1.GpuServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix:"+path, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return v1alpha1.NewGpuServiceClient(conn)
}
