package nodegpu

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOperatorPauseReason: only the operator's deploy labels set to paused-* pause GPU clients,
// a Node that cannot be read pauses nothing (Lookup says why), and no watch pauses nothing.
func TestOperatorPauseReason(t *testing.T) {
	unreadable := errors.New("the API server does not answer")
	for _, tc := range []struct {
		name       string
		labels     map[string]string
		err        error
		wantReason string
	}{
		{name: "no labels"},
		{name: "deployed", labels: map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}},
		{name: "paused, in label order", labels: map[string]string{
			"nvidia.com/gpu.deploy.dcgm":          "paused-for-driver-upgrade",
			"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
			"example.com/other":                   "paused-for-driver-upgrade",
		}, wantReason: PausedReasonPrefix + " (nvidia.com/gpu.deploy.dcgm=paused-for-driver-upgrade, nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade)"},
		{name: "an unreadable Node", err: unreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewOperatorPause(func(context.Context) (*corev1.Node, error) {
				if tc.err != nil {
					return nil, tc.err
				}
				return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: tc.labels}}, nil
			})
			if got := p.Reason(t.Context()); got != tc.wantReason {
				t.Errorf("Reason() = %q, want %q", got, tc.wantReason)
			}
			if _, err := p.Lookup(t.Context()); !errors.Is(err, tc.err) {
				t.Errorf("Lookup() error = %v, want %v", err, tc.err)
			}
		})
	}
	var none *OperatorPause
	if r, err := none.Lookup(t.Context()); r != "" || err != nil || none.Changes() != nil {
		t.Errorf("a nil OperatorPause: Lookup() = %q, %v, Changes() = %v; want nothing", r, err, none.Changes())
	}
}

// TestOperatorPauseNotify: changes not yet received are signalled once.
func TestOperatorPauseNotify(t *testing.T) {
	p := NewOperatorPause(nil)
	p.Notify()
	p.Notify()
	select {
	case <-p.Changes():
	default:
		t.Fatal("no change signalled after Notify")
	}
	select {
	case <-p.Changes():
		t.Fatal("two changes signalled for two Notify calls not yet received")
	default:
	}
}
