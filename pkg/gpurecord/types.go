package gpurecord

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The resource's identity.
const (
	Group    = "gpuhealth.dev"
	Version  = "v1alpha1"
	Kind     = "GPURecord"
	Resource = "gpurecords"
)

// SchemeGroupVersion is the group version GPURecords are served at.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Bounds of one record.
const (
	// MaxEvents bounds GPURecord.Events: the oldest go first; Counts keep counting.
	MaxEvents = 64
	// MaxPlacements bounds GPURecord.Placements: the placement seen longest ago goes first.
	MaxPlacements = 16
)

// GPURecord is one physical GPU's life across nodes: where it was, and what happened to it
// there. Its name is NameFor(Serial).
type GPURecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Serial is the board serial number (NVML nvmlDeviceGetSerial), as the agent reported it.
	Serial string `json:"serial"`
	// Model is the GPU's model, as last reported.
	Model string `json:"model,omitempty"`
	// Placements are the nodes the GPU was seen in, oldest first.
	Placements []Placement `json:"placements,omitempty"`
	// Events are the newest MaxEvents things that happened to it, oldest first.
	Events []Event `json:"events,omitempty"`
	// Counts count every event the record ever took, by kind, including those Events dropped.
	Counts map[EventKind]int `json:"counts,omitempty"`
}

// Placement is one node a GPU was seen in.
type Placement struct {
	Node  string `json:"node"`
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// FirstSeen and LastSeen bound when the controller saw the GPU there: the first and the
	// newest report that named it.
	FirstSeen metav1.Time `json:"firstSeen"`
	LastSeen  metav1.Time `json:"lastSeen"`
}

// EventKind says what an Event records.
type EventKind string

// What a record keeps. Fault, reset, reboot and cleared are the agent's history entries
// (health.HistoryKind); the others come from the rest of its report.
const (
	EventFault      EventKind = "fault"
	EventReset      EventKind = "reset"
	EventReboot     EventKind = "reboot"
	EventCleared    EventKind = "cleared"
	EventValidation EventKind = "validation"
	EventDrain      EventKind = "drain"
	// EventReplaceGPU: the agent escalated the GPU to ReplaceGPU (its fault kept returning
	// after repairs).
	EventReplaceGPU EventKind = "replaceGPU"
)

// Event is one thing that happened to a GPU on a node.
type Event struct {
	Time metav1.Time `json:"time"`
	Kind EventKind   `json:"kind"`
	// Reason is the fault's reason (XID79, ECCUncorrected...), a validation's result or a
	// drain's reason.
	Reason string `json:"reason,omitempty"`
	// By is what judged a validation, or who drained.
	By    string `json:"by,omitempty"`
	Node  string `json:"node"`
	Index int    `json:"index"`
}

// same reports whether e and o record one event (the controller sees each report many times).
func (e Event) same(o Event) bool {
	return e.Kind == o.Kind && e.Reason == o.Reason && e.Node == o.Node && e.Time.Equal(&o.Time)
}

// FaultsSince returns the record's fault events at or after since, oldest first.
func (r *GPURecord) FaultsSince(since time.Time) []Event {
	var out []Event
	for _, e := range r.Events {
		if e.Kind == EventFault && !e.Time.Time.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

// GPURecordList is a list of GPURecords.
type GPURecordList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPURecord `json:"items"`
}

// AddToScheme registers GPURecord and GPURecordList with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &GPURecord{}, &GPURecordList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// DeepCopy returns a copy of r that shares nothing with it.
func (r *GPURecord) DeepCopy() *GPURecord {
	if r == nil {
		return nil
	}
	out := *r
	r.ObjectMeta.DeepCopyInto(&out.ObjectMeta) //nolint:staticcheck // explicit: GPURecord has no DeepCopyInto of its own
	out.Placements = slices.Clone(r.Placements)
	out.Events = slices.Clone(r.Events)
	if r.Counts != nil {
		out.Counts = make(map[EventKind]int, len(r.Counts))
		for k, v := range r.Counts {
			out.Counts[k] = v
		}
	}
	return &out
}

// DeepCopyObject implements runtime.Object.
func (r *GPURecord) DeepCopyObject() runtime.Object { return r.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *GPURecordList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta) //nolint:staticcheck // GPURecordList has no DeepCopyInto of its own
	out.Items = make([]GPURecord, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopy()
	}
	return &out
}
