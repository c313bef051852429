package main

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

type fakeDrainSink chan map[string]string

func (f fakeDrainSink) SetDrains(drained map[string]string, _ time.Time) []string {
	f <- drained
	return nil
}

// TestWatchDrains checks that the drains annotation reaches the library as a complete set,
// that a malformed one keeps the drains in force, and that an undrain empties the set.
func TestWatchDrains(t *testing.T) {
	drain := gpuhealthv1.Drain{Index: 1, Reason: "bad fan", By: "ops", At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	b, err := json.Marshal(map[string]gpuhealthv1.Drain{"GPU-1": drain})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Annotations: map[string]string{gpuhealthv1.DrainsKey: string(b)}}}
	client := fake.NewClientset(node)
	sink := make(fakeDrainSink, 10)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- watchDrains(ctx, client, "node-a", sink) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	next := func() map[string]string {
		t.Helper()
		select {
		case s := <-sink:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no drains applied")
			return nil
		}
	}
	update := func(value string) {
		t.Helper()
		node.Annotations[gpuhealthv1.DrainsKey] = value
		if _, err := client.CoreV1().Nodes().Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	if got, want := next(), map[string]string{"GPU-1": drain.Message()}; !maps.Equal(got, want) {
		t.Fatalf("drains %v, want %v", got, want)
	}
	update("{not json")
	update("")
	if got := next(); len(got) != 0 {
		t.Fatalf("after the undrain: %v, want none (and nothing for the malformed value)", got)
	}
}
