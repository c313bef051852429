package nvsentinel

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// connection is the gRPC channel to the platform-connector, and whether the server that
// acknowledged the last send is still the one listening. NVSentinel's server removes its socket
// file and makes a new one when it starts, and knows nothing of what its predecessor was told; a
// channel whose transport closed leaves READY. Either means that everything must be sent again.
type connection struct {
	socket string
	conn   *grpc.ClientConn
	client datamodels.PlatformConnectorClient
	// connected: the last send on conn succeeded, to the socket file acked.
	connected bool
	acked     os.FileInfo
}

// check reports whether the socket exists, and drops a connection that no longer stands: the
// socket is gone or was made anew, or the channel left READY.
func (c *connection) check() bool {
	fi, err := os.Stat(c.socket)
	if err != nil {
		c.drop()
		return false
	}
	if c.connected && (!sameSocket(c.acked, fi) || c.conn.GetState() != connectivity.Ready) {
		c.drop()
	}
	return true
}

// sameSocket reports whether two looks at the socket saw the same file: a restarted server's
// socket is a new file, with a new modification time even where the inode number is reused.
func sameSocket(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}

// send sends one batch, dialling first when there is no channel. A channel that ran over a
// server change while sending counts as not connected: the next send sends everything again.
func (c *connection) send(ctx context.Context, batch *datamodels.HealthEvents) error {
	before, err := os.Stat(c.socket)
	if err != nil {
		return err
	}
	if c.conn == nil {
		// Idleness off: an idle channel leaves READY too, which would look like a lost server.
		conn, err := grpc.NewClient("unix:"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithIdleTimeout(0))
		if err != nil {
			return fmt.Errorf("dial %s: %w", c.socket, err)
		}
		c.conn, c.client = conn, datamodels.NewPlatformConnectorClient(conn)
	}
	if _, err := c.client.HealthEventOccurredV1(ctx, batch); err != nil {
		return fmt.Errorf("HealthEventOccurredV1 on %s: %w", c.socket, err)
	}
	after, err := os.Stat(c.socket)
	if err != nil || !sameSocket(before, after) {
		c.drop()
		return nil
	}
	c.connected, c.acked = true, after
	return nil
}

// drop closes the channel: the next send dials afresh, without the channel's own reconnect
// backoff (the publisher has its own).
func (c *connection) drop() {
	_ = c.close()
}

func (c *connection) close() error {
	c.connected, c.acked = false, nil
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn, c.client = nil, nil
	return err
}
