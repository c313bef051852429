package simdriver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// Injecting one event at once (`gpuhealth sim-driver inject`): both ends of the exchange, Inject
// the client's and server.inject the simulator's.

// parseEvent reads one scenario event without `at`, in the scenario file's own YAML form, for
// the GPUs of sc.
func parseEvent(sc *sim.Scenario, body []byte) (sim.Event, error) {
	var fields map[string]any
	if err := yaml.Unmarshal(body, &fields); err != nil {
		return sim.Event{}, fmt.Errorf("the event is not a YAML mapping: %w", err)
	}
	if fields == nil {
		return sim.Event{}, errors.New("empty event")
	}
	for _, k := range []string{"at", "afterReset"} {
		if _, ok := fields[k]; ok {
			return sim.Event{}, fmt.Errorf("%s: an injected event happens now; leave it out", k)
		}
	}
	fields["at"] = "0s"
	ev, err := yaml.Marshal(fields)
	if err != nil {
		return sim.Event{}, err
	}
	doc := fmt.Sprintf("apiVersion: %s\nkind: %s\nnode: %s\ngpus:\n  count: %d\n", sim.APIVersion, sim.Kind, sc.Node, sc.GPUCount)
	if len(sc.MIGInstances) > 0 {
		doc += "  migInstances: {"
		first := true
		for i, n := range sc.MIGInstances {
			if !first {
				doc += ", "
			}
			first = false
			doc += fmt.Sprintf("%q: %d", fmt.Sprint(i), n)
		}
		doc += "}\n"
	}
	doc += "events:\n- " + strings.ReplaceAll(strings.TrimSpace(string(ev)), "\n", "\n  ") + "\n"
	parsed, err := sim.ParseDriverScenario([]byte(doc))
	if err != nil {
		return sim.Event{}, err
	}
	if len(parsed.Events) != 1 {
		return sim.Event{}, errors.New("the event describes nothing to do")
	}
	if err := checkEvent(parsed.Events[0]); err != nil {
		return sim.Event{}, err
	}
	return parsed.Events[0], nil
}

// ErrInjectRefused wraps the simulator's refusal of an injected event (bad input).
var ErrInjectRefused = errors.New("the simulator refused the event")

// ErrInjectForbidden wraps the simulator's refusal of the process that injects: only root and the
// simulator's own user (and Options.InjectUIDs), from the simulator's pid namespace, may (peer.go).
var ErrInjectForbidden = errors.New("the simulator takes no injection from this process")

// Inject applies one event at once on the simulator serving the driver root (its socket is
// looked for in the library directories a driver root has).
func Inject(driverRoot, event string) error {
	c, err := net.DialTimeout("unix", findSocket(driverRoot), 5*time.Second)
	if err != nil {
		return fmt.Errorf("no simulator serves %s: %w", driverRoot, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	// The request and the event in one write: the simulator answers a bad request at once and
	// hangs up, and a second write could meet the closed connection.
	var msg bytes.Buffer
	if err := writeRequest(&msg, &request{Op: opInject, C: uint64(len(event))}); err != nil {
		return err
	}
	msg.WriteString(event)
	if _, err := c.Write(msg.Bytes()); err != nil {
		return err
	}
	var resp response
	if err := readResponse(c, &resp); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	var n uint32
	if err := binary.Read(c, binary.LittleEndian, &n); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	reason := make([]byte, min(n, maxInject))
	if _, err := io.ReadFull(c, reason); err != nil {
		return fmt.Errorf("reading the simulator's answer: %w", err)
	}
	switch {
	case resp.Ret == retNoPermission:
		return fmt.Errorf("%w: %s", ErrInjectForbidden, reason)
	case resp.Ret != retSuccess && resp.N == 1:
		return fmt.Errorf("the simulated driver cannot do it now: %s", reason)
	case resp.Ret != retSuccess:
		return fmt.Errorf("%w: %s", ErrInjectRefused, reason)
	}
	return nil
}

// maxInject bounds an injected event's YAML.
const maxInject = 64 << 10

// inject applies one event from `sim-driver inject`, when who may change the GPUs: C bytes of
// YAML follow the request; the answer is the response and, on error, the message's length and
// bytes.
func (s *server) inject(c net.Conn, r io.Reader, req *request, who peer) {
	var resp response
	msg := ""
	switch err := s.permit(who, "injection"); {
	case err != nil:
		resp.Ret, msg = retNoPermission, err.Error()
	case req.C > maxInject:
		resp.Ret, msg = retInvalidArgument, fmt.Sprintf("the event is %d bytes, more than %d", req.C, maxInject)
	default:
		body := make([]byte, req.C)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		s.node.mu.Lock()
		ev, err := parseEvent(s.node.sc, body)
		refused := false
		if err == nil {
			if err = s.node.apply(ev); err == nil {
				s.log.Info("Injected", "event", string(body), "pid", who.pid, "uid", who.uid)
			} else {
				refused = true
			}
		}
		s.node.mu.Unlock()
		if err != nil {
			resp.Ret, msg = retInvalidArgument, err.Error()
		}
		if refused {
			resp.N = 1 // valid, but the driver refused it now: not bad input
		}
	}
	_ = writeResponse(c, &resp)
	_ = binary.Write(c, binary.LittleEndian, uint32(len(msg)))
	_, _ = io.WriteString(c, msg)
}
