// Command nodenet holds the network namespace in which a local test cluster's kubelets live, and
// carries the only two kinds of traffic that cross its border. The harness (test/controlplane)
// starts it in a new network namespace (CLONE_NEWNET) and hands it the machine's own namespace as
// file descriptor 3.
//
// Why a namespace: a kubelet refuses a loopback node IP, and by default it picks the machine's
// own interface, which kube-apiserver then dials for `kubectl logs` and `exec`. Tests may only
// use loopback and addresses inside namespaces they create, so each kubelet gets an address from
// 198.51.100.0/24 (TEST-NET-2, documentation range) on this namespace's loopback device.
//
// The two crossings, both on the machine's own loopback or a unix socket:
//   - kubelet → kube-apiserver: a TCP listener on this namespace's 127.0.0.1:<apiserver port>
//     forwards each connection to the machine's 127.0.0.1:<apiserver port>, so node kubeconfigs
//     name the same URL as every other client and the apiserver's serving certificate fits.
//   - kube-apiserver → kubelet: kube-apiserver's egress selector sends its "cluster" traffic
//     (kubelet logs/exec/port-forward, webhooks) as HTTP CONNECT over a unix socket served here.
//     Targets inside the node range are dialled in this namespace; loopback targets in the
//     machine's namespace (webhooks of tests); anything else is refused.
//
// With --service-address (the `kubernetes` Service's ClusterIP:port) it also puts that address on
// this namespace's loopback device and forwards it like the kubelets' listener, so pods (whose CNI
// gateway is this namespace) reach kube-apiserver through the in-cluster configuration the kubelet
// gives them (KUBERNETES_SERVICE_HOST/PORT), with no kube-proxy; see docs/controlplane.md.
//
// It stops on SIGTERM/SIGINT; when it and every kubelet have exited, the namespace is gone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	apiserver := flag.String("apiserver", "", "host:port of kube-apiserver in the machine's namespace, also listened on in this one")
	egressSocket := flag.String("egress-socket", "", "unix socket path for kube-apiserver's HTTP CONNECT egress")
	nodeCIDR := flag.String("node-cidr", "198.51.100.0/24", "node addresses that are dialled inside this namespace")
	serviceAddress := flag.String("service-address", "", "ip:port of the kubernetes Service, served in this namespace and forwarded to --apiserver (empty: none)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if err := run(*apiserver, *egressSocket, *nodeCIDR, *serviceAddress); err != nil {
		log.Printf("nodenet: %v", err)
		os.Exit(1)
	}
}

func run(apiserver, egressSocket, nodeCIDR, serviceAddress string) error {
	if apiserver == "" || egressSocket == "" {
		return errors.New("--apiserver and --egress-socket are required")
	}
	apiAddr, err := netip.ParseAddrPort(apiserver)
	if err != nil || !apiAddr.Addr().IsLoopback() {
		return fmt.Errorf("--apiserver %q: want a loopback host:port", apiserver)
	}
	nodes, err := netip.ParsePrefix(nodeCIDR)
	if err != nil {
		return fmt.Errorf("--node-cidr: %w", err)
	}
	hostNS := os.NewFile(3, "host-netns")
	if hostNS == nil {
		return errors.New("fd 3 (the machine's network namespace) is not open")
	}
	if _, err := unix.FcntlInt(hostNS.Fd(), unix.F_GETFD, 0); err != nil {
		return fmt.Errorf("fd 3 (the machine's network namespace): %w", err)
	}
	ownNS, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return fmt.Errorf("open own network namespace: %w", err)
	}
	same, err := sameFile(hostNS, ownNS)
	if err != nil {
		return err
	}
	if same {
		return errors.New("started in the machine's own network namespace; the harness must start nodenet with CLONE_NEWNET")
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %w: %s", err, out)
	}
	d := &dialer{host: hostNS, own: ownNS}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	forward, err := net.Listen("tcp", apiAddr.String())
	if err != nil {
		return fmt.Errorf("listen for kubelets on %s: %w", apiAddr, err)
	}
	listeners := []net.Listener{forward}
	if serviceAddress != "" {
		svc, err := netip.ParseAddrPort(serviceAddress)
		if err != nil {
			return fmt.Errorf("--service-address: %w", err)
		}
		if out, err := exec.Command("ip", "addr", "replace", svc.Addr().String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("add the service address %s: %w: %s", svc.Addr(), err, out)
		}
		l, err := net.Listen("tcp", svc.String())
		if err != nil {
			return fmt.Errorf("listen for pods on %s: %w", svc, err)
		}
		listeners = append(listeners, l)
		log.Printf("forwarding pods' %s to the machine's %s", svc, apiAddr)
	}
	_ = os.Remove(egressSocket)
	egress, err := net.Listen("unix", egressSocket)
	if err != nil {
		return fmt.Errorf("listen for kube-apiserver egress on %s: %w", egressSocket, err)
	}
	log.Printf("forwarding kubelets' %s to the machine's %s; egress proxy on %s for %s", apiAddr, apiAddr, egressSocket, nodes)

	var wg sync.WaitGroup
	server := &http.Server{Handler: &connectProxy{dialer: d, nodes: nodes}, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := server.Serve(egress); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("egress proxy: %v", err)
			stop()
		}
	})
	for _, l := range listeners {
		wg.Go(func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					if ctx.Err() == nil {
						log.Printf("forwarder %s: %v", l.Addr(), err)
						stop()
					}
					return
				}
				go func() {
					upstream, err := d.dialHost(ctx, apiAddr.String())
					if err != nil {
						log.Printf("forward %s: %v", conn.RemoteAddr(), err)
						_ = conn.Close()
						return
					}
					splice(conn, upstream)
				}()
			}
		})
	}
	<-ctx.Done()
	for _, l := range listeners {
		_ = l.Close()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdownCtx)
	wg.Wait()
	_ = os.Remove(egressSocket)
	return nil
}

// dialer dials in this namespace or, for loopback targets of the machine, in the machine's.
type dialer struct {
	host, own *os.File
}

// dialHost dials addr from the machine's network namespace. The socket is created on an OS thread
// that has entered that namespace and keeps it after the thread returns; the thread is put back
// into our namespace, or left locked (and so discarded by the Go runtime) if that fails.
func (d *dialer) dialHost(ctx context.Context, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(d.host.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter the machine's network namespace: %w", err)}
			return
		}
		var nd net.Dialer
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := nd.DialContext(dctx, "tcp", addr)
		cancel()
		if err := unix.Setns(int(d.own.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime ends it with this goroutine.
			ch <- result{conn: conn, err: err}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{conn: conn, err: err}
	}()
	r := <-ch
	return r.conn, r.err
}

// connectProxy serves kube-apiserver's egress selector (HTTPConnect over a unix socket).
type connectProxy struct {
	dialer *dialer
	nodes  netip.Prefix
}

func (p *connectProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "only CONNECT is served", http.StatusMethodNotAllowed)
		return
	}
	target, err := netip.ParseAddrPort(r.Host)
	if err != nil {
		http.Error(w, fmt.Sprintf("target %q: want ip:port (set --kubelet-preferred-address-types=InternalIP)", r.Host), http.StatusBadRequest)
		return
	}
	var upstream net.Conn
	switch {
	case p.nodes.Contains(target.Addr()):
		var nd net.Dialer
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		upstream, err = nd.DialContext(ctx, "tcp", target.String())
		cancel()
	case target.Addr().IsLoopback():
		upstream, err = p.dialer.dialHost(r.Context(), target.String())
	default:
		log.Printf("refused CONNECT %s: neither a node address nor loopback", target)
		http.Error(w, "target outside the test cluster's addresses", http.StatusForbidden)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hijacker, ok := w.(http.Hijacker)
	if !ok {
		_ = upstream.Close()
		http.Error(w, "hijacking not supported", http.StatusInternalServerError)
		return
	}
	conn, buf, err := hijacker.Hijack()
	if err != nil {
		_ = upstream.Close()
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = conn.Close()
		_ = upstream.Close()
		return
	}
	// Bytes the client sent after its CONNECT request may already sit in the buffer.
	if n := buf.Reader.Buffered(); n > 0 {
		pending, _ := buf.Reader.Peek(n)
		if _, err := upstream.Write(pending); err != nil {
			_ = conn.Close()
			_ = upstream.Close()
			return
		}
	}
	splice(conn, upstream)
}

// splice copies both ways until either side closes, then closes both.
func splice(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() {
		_ = a.Close()
		_ = b.Close()
	}
	go func() {
		_, _ = io.Copy(a, b)
		once.Do(closeBoth)
	}()
	_, _ = io.Copy(b, a)
	once.Do(closeBoth)
}

func sameFile(a, b *os.File) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a.Fd()), &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(b.Fd()), &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
