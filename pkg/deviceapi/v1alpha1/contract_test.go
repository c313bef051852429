package v1alpha1_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
)

// TestWireContract pins what a client built from NVSentinel's gpu.proto relies on: the package,
// the service and its methods (their paths on the wire), and every message's field names,
// numbers and kinds. A change here breaks the Device API's clients, whatever gpuhealth's own
// tests say.
func TestWireContract(t *testing.T) {
	fd := v1alpha1.File_deviceapi_v1alpha1_gpu_proto
	if got := fd.Package(); got != "nvidia.nvsentinel.v1alpha1" {
		t.Fatalf("package %s", got)
	}
	svc := fd.Services().ByName("GpuService")
	if svc == nil {
		t.Fatal("no GpuService")
	}
	methods := map[string]string{}
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		methods[string(m.Name())] = fmt.Sprintf("%s -> %s stream=%v/%v", m.Input().Name(), m.Output().Name(), m.IsStreamingClient(), m.IsStreamingServer())
	}
	wantMethods := map[string]string{
		"GetGpu":    "GetGpuRequest -> GetGpuResponse stream=false/false",
		"ListGpus":  "ListGpusRequest -> ListGpusResponse stream=false/false",
		"WatchGpus": "WatchGpusRequest -> WatchGpusResponse stream=false/true",
	}
	if !maps.Equal(methods, wantMethods) {
		t.Errorf("methods %v, want %v", methods, wantMethods)
	}
	if got := v1alpha1.GpuService_WatchGpus_FullMethodName; got != "/nvidia.nvsentinel.v1alpha1.GpuService/WatchGpus" {
		t.Errorf("WatchGpus path %s", got)
	}

	// Each message's fields: name=number:kind (a message field names its type).
	want := map[string][]string{
		"Gpu":               {"name=1:string", "spec=2:GpuSpec", "status=3:GpuStatus"},
		"GpuList":           {"items=1:repeated Gpu"},
		"GpuSpec":           {"uuid=1:string"},
		"GpuStatus":         {"conditions=1:repeated Condition", "recommended_action=2:string"},
		"Condition":         {"type=1:string", "status=2:string", "last_transition_time=3:Timestamp", "reason=4:string", "message=5:string"},
		"GetGpuRequest":     {"name=1:string"},
		"GetGpuResponse":    {"gpu=1:Gpu"},
		"ListGpusRequest":   nil,
		"ListGpusResponse":  {"gpu_list=1:GpuList"},
		"WatchGpusRequest":  nil,
		"WatchGpusResponse": {"type=1:string", "object=2:Gpu"},
	}
	got := map[string][]string{}
	for i := range fd.Messages().Len() {
		m := fd.Messages().Get(i)
		var fields []string
		for j := range m.Fields().Len() {
			fields = append(fields, field(m.Fields().Get(j)))
		}
		got[string(m.Name())] = fields
	}
	if !maps.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Errorf("messages\n%v\nwant\n%v", got, want)
	}
}

func field(f protoreflect.FieldDescriptor) string {
	kind := f.Kind().String()
	if f.Message() != nil {
		kind = string(f.Message().Name())
	}
	if f.Cardinality() == protoreflect.Repeated {
		kind = "repeated " + kind
	}
	return fmt.Sprintf("%s=%d:%s", f.Name(), f.Number(), kind)
}
