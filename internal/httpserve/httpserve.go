// Package httpserve runs the small HTTP servers of gpuhealth's long-running components (/metrics,
// /healthz, /readyz): serve until the context ends, then shut down gracefully.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// ShutdownTimeout bounds how long in-flight requests may take once the context ends.
const ShutdownTimeout = 5 * time.Second

// Serve serves handler on lis until ctx is done, then shuts the server down, and returns nil
// after a clean shutdown.
func Serve(ctx context.Context, lis net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
