package simdriver

import (
	"bufio"
	"context"
	"errors"
	"net"
	"time"
)

// One consumer's connection: the library's calls from one thread of one process, answered
// until the process goes.

// sleepUntil waits until t on the real clock (a hanging call hangs for real).
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// serveConn serves one connection: a HELLO, then calls until the peer goes. The process is the
// one the kernel names (peer.go), whatever pid its HELLO gives.
func (s *server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	who, err := peerOf(c)
	if err != nil {
		s.log.Info("A connection closed unserved", "reason", err.Error())
		return
	}
	r := bufio.NewReaderSize(c, reqSize*4)
	var req request
	if err := readRequest(r, &req); err != nil {
		return
	}
	var resp response
	switch req.Op {
	case opInject:
		s.inject(c, r, &req, who)
		return
	case opDiag:
		s.diag(ctx, c, r, &req)
		return
	case opDiscovery:
		s.discovery(c)
		return
	case opHello:
	default:
		return
	}
	pid := who.process(req.A)
	if req.B != wireVersion {
		resp.Ret = retUnknown
		_ = writeResponse(c, &resp)
		s.log.Info("A library of another wire version connected: refused", "pid", pid, "version", req.B)
		return
	}
	if lib := req.str(); lib != s.version {
		// A process that loaded the library of the driver served before (a driver upgrade
		// under it): NVIDIA's "Driver/library version mismatch".
		resp.Ret = retLibRMVersionMismatch
		_ = writeResponse(c, &resp)
		s.log.Info("A library of another driver version connected: answered LIB_RM_VERSION_MISMATCH", "pid", pid, "library", lib, "driver", s.version)
		return
	}
	if err := writeResponse(c, &resp); err != nil {
		return
	}
	s.mu.Lock()
	s.conns[c] = pid
	s.perPID[pid]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.perPID[pid]--
		last := s.perPID[pid] == 0
		if last {
			delete(s.perPID, pid)
		}
		s.mu.Unlock()
		if last {
			s.node.mu.Lock()
			s.node.closeProcess(pid)
			s.node.mu.Unlock()
		}
	}()
	for {
		if err := readRequest(r, &req); err != nil {
			return
		}
		resp = response{}
		switch {
		case req.Op == opEventSetWait:
			if !s.waitWatching(ctx, c, r, pid, &req, &resp) {
				return // the consumer died in the middle of its wait
			}
		case req.Op == opReset && s.permit(who, "GPU reset") != nil:
			resp.Ret = retNoPermission // as a real reset by a user who is not root: nvidia-smi exits 4
		default:
			s.node.mu.Lock()
			hangUntil := s.node.answer(pid, &req, &resp)
			s.node.mu.Unlock()
			if !sleepUntil(ctx, hangUntil) { // a wedged GPU answers late
				return
			}
		}
		if err := writeResponse(c, &resp); err != nil {
			return
		}
	}
}

// waitWatching serves nvmlEventSetWait while watching the connection: the consumer's thread
// sends nothing while it waits for this answer, so anything readable (the end of the stream
// above all) means the consumer is gone, and the wait ends at once instead of at its timeout. It
// returns false then.
func (s *server) waitWatching(ctx context.Context, c net.Conn, r *bufio.Reader, pid uint32, req *request, resp *response) bool {
	gone := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := r.Peek(1); !isTimeout(err) {
			close(gone) // EOF, an error, or bytes no live consumer would send now
		}
	}()
	s.wait(ctx, pid, req, resp, gone)
	_ = c.SetReadDeadline(time.Now()) // ends the Peek
	<-watched
	_ = c.SetReadDeadline(time.Time{})
	select {
	case <-gone:
		return false
	default:
		return true
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// wait serves nvmlEventSetWait: the next event, or TIMEOUT after the call's timeout. It ends
// early when gone is closed.
func (s *server) wait(ctx context.Context, pid uint32, req *request, resp *response, gone <-chan struct{}) {
	deadline := time.Now().Add(time.Duration(req.B) * time.Millisecond)
	for {
		s.node.mu.Lock()
		wake, done := s.node.next(pid, req.A, resp)
		s.node.mu.Unlock()
		if done {
			return
		}
		d := time.Until(deadline)
		if d <= 0 {
			resp.Ret = retTimeout
			return
		}
		timer := time.NewTimer(d)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			resp.Ret = retUnknown
		case <-gone:
			resp.Ret = retUnknown
		}
		timer.Stop()
		if resp.Ret != retSuccess {
			return
		}
	}
}
