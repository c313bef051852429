// Package httpserve runs the HTTP servers of gpuhealth's long-running components (the agent's and
// the breaker controller's /metrics and /healthz, the scheduler extender's API): serve until the
// context ends, then shut down gracefully, and return only once the shutdown is over. It is the one
// serve loop of the tree, so that every component drains its requests the same way.
package httpserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

const (
	// DefaultShutdownTimeout bounds how long in-flight requests may take once the context ends.
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultReadHeaderTimeout bounds how long a client may take to send a request's headers.
	DefaultReadHeaderTimeout = 5 * time.Second
)

type options struct {
	shutdownTimeout                        time.Duration
	readHeaderTimeout                      time.Duration
	readTimeout, writeTimeout, idleTimeout time.Duration
	tls                                    *tls.Config
}

// WithTimeouts bounds how long a client may take to send a whole request (read), how long a
// response may take to write (write), and how long a kept-alive connection may sit idle; 0 keeps
// a bound off. A client that trickles a body cannot hold a connection (and its buffer) forever.
func WithTimeouts(read, write, idle time.Duration) Option {
	return func(o *options) { o.readTimeout, o.writeTimeout, o.idleTimeout = read, write, idle }
}

// WithTLS serves TLS with cfg (its certificates and client authentication) instead of plain
// HTTP.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// Option changes how Serve serves.
type Option func(*options)

// WithShutdownTimeout bounds how long Serve waits for in-flight requests once the context ends;
// d <= 0 keeps DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.shutdownTimeout = d
		}
	}
}

// WithReadHeaderTimeout bounds how long a client may take to send a request's headers; d <= 0
// keeps DefaultReadHeaderTimeout.
func WithReadHeaderTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.readHeaderTimeout = d
		}
	}
}

// Serve serves handler on lis until ctx ends, then stops accepting connections and waits for the
// requests in flight, for at most the shutdown timeout, before it returns. It returns nil after a
// clean shutdown, an error wrapping context.DeadlineExceeded when requests were still running at
// the timeout (their connections are closed), and the listener's error when serving failed before
// ctx ended. Serve closes lis in every case.
//
// Requests see the values of ctx (its logger, for one) but not its cancellation: a request that
// started before the shutdown may finish its work, such as an API call, while the server drains.
func Serve(ctx context.Context, lis net.Listener, handler http.Handler, opts ...Option) error {
	o := options{shutdownTimeout: DefaultShutdownTimeout, readHeaderTimeout: DefaultReadHeaderTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	base := context.WithoutCancel(ctx)
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: o.readHeaderTimeout,
		ReadTimeout:       o.readTimeout,
		WriteTimeout:      o.writeTimeout,
		IdleTimeout:       o.idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	if o.tls != nil {
		lis = tls.NewListener(lis, o.tls)
	}
	// served is written once by the goroutine below, which Serve always waits for.
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	var serveErr error
	select {
	case serveErr = <-served:
		// The listener failed; connections accepted before may still be serving requests.
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(base, o.shutdownTimeout)
	defer cancel()
	// Shutdown closes lis and returns once every connection is idle: it is what waits for the
	// requests in flight. http.Server.Serve itself returns as soon as Shutdown begins.
	shutdownErr := srv.Shutdown(shutdownCtx)
	if shutdownErr != nil {
		_ = srv.Close()
		shutdownErr = fmt.Errorf("requests still running %v after shutdown began: %w", o.shutdownTimeout, shutdownErr)
	}
	if serveErr == nil {
		serveErr = <-served
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return errors.Join(serveErr, shutdownErr)
}
