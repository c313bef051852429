package remediation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// A GPU reset fails while any process holds the GPU, and on a node of NVIDIA's GPU operator its
// components do by default: DCGM, dcgm-exporter, GPU feature discovery, NVIDIA's device plugin
// (mig-parted#181, the operator's reset issues). They are DaemonSets that select their nodes by
// a label each, nvidia.com/gpu.deploy.<component>=true; the operator's own managers pause them
// by changing that label and wait for their pods to leave. Remediation does the same when the
// user allows it (remediation.pauseOperatorComponents): once it holds a slot it records each
// label's value in a file, sets the labels to ComponentPausedValue, waits for the pods to go,
// resets, and then restores exactly the values it recorded, on labels it still finds paused by
// it (also after an agent crash in between: the record is on disk before the first change).
// Without that permission a GPU held by the components waits, saying so. Only the components
// that are GPU clients count (GPUClientComponents).

// GPUClientComponents are the operator's components that hold the GPUs through NVML, by their
// labels: the only ones remediation waits for or pauses. The others (the driver itself, the
// container toolkit, the validator, the MIG manager, sandbox and vGPU managers, third-party
// clients under nvidia.com/gpu.deploy.client, gpuhealth among them) must never be paused for a
// reset: pausing the driver unloads it, the toolkit undoes the node's runtime configuration.
var GPUClientComponents = []string{
	OperatorDeployLabelPrefix + "dcgm",
	OperatorDeployLabelPrefix + "dcgm-exporter",
	OperatorDeployLabelPrefix + "device-plugin",
	OperatorDeployLabelPrefix + "gpu-feature-discovery",
}

// ComponentPausedValue is what remediation sets a component's label to while it resets a GPU.
// It does not start with OperatorPausedPrefix: the operator's own pauses (driver upgrade, MIG
// change) make every NVML client let go and every repair wait, and this one must not.
const ComponentPausedValue = "paused-by-gpuhealth"

// ComponentRecordFileName is the pause record's name, next to the state file.
const ComponentRecordFileName = "operator-components.json"

// Component is one of the GPU operator's components running on the node.
type Component struct {
	// Label is the component's nvidia.com/gpu.deploy.* label.
	Label string
	// Pods are its pods on the node, "namespace/name".
	Pods []string
}

// Components finds the GPU operator's GPU clients on the node: the running pods whose
// nodeSelector has one of the GPUClientComponents labels, by that label.
type Components struct {
	Client   kube.Interface
	NodeName string
	// Self is this agent's own pod, "namespace/name" (it lets go of NVML for a reset itself);
	// "" when it runs outside a pod.
	Self string
}

// Running lists the components with a pod on the node, by label.
func (c Components) Running(ctx context.Context) ([]Component, error) {
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", c.NodeName).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the pods on %s: %w", c.NodeName, err)
	}
	byLabel := map[string][]string{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		name := pod.Namespace + "/" + pod.Name
		if pod.Spec.NodeName != c.NodeName || name == c.Self || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for k := range pod.Spec.NodeSelector {
			if slices.Contains(GPUClientComponents, k) {
				byLabel[k] = append(byLabel[k], name)
			}
		}
	}
	out := make([]Component, 0, len(byLabel))
	for k, pods := range byLabel {
		slices.Sort(pods)
		out = append(out, Component{Label: k, Pods: pods})
	}
	slices.SortFunc(out, func(a, b Component) int { return strings.Compare(a.Label, b.Label) })
	return out, nil
}

// DescribeComponents names components and their pods for a message.
func DescribeComponents(cs []Component) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s (%s)", strings.TrimPrefix(c.Label, OperatorDeployLabelPrefix), strings.Join(c.Pods, ", ")))
	}
	return strings.Join(parts, ", ")
}

// ComponentPauser pauses the operator's components through the Node's labels and restores them,
// keeping what it changed in a record file written before any change. It reads the Node from the
// API server, never from a cache: a label it has just written must be seen as written.
type ComponentPauser struct {
	client   kube.Interface
	nodeName string
	path     string // "" keeps the record in memory only

	mu sync.Mutex
	// record maps each label it paused to the value it had (nil: it had none).
	record map[string]*string
}

// pauseRecord is the record file's content.
type pauseRecord struct {
	Node   string             `json:"node"`
	Labels map[string]*string `json:"labels"`
}

// NewComponentPauser reads the record at path (a pause an earlier agent did not restore).
func NewComponentPauser(client kube.Interface, nodeName, path string) (*ComponentPauser, error) {
	p := &ComponentPauser{client: client, nodeName: nodeName, path: path, record: map[string]*string{}}
	if path == "" {
		return p, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return nil, err
	}
	var r pauseRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Node == nodeName {
		for k, v := range r.Labels {
			if slices.Contains(GPUClientComponents, k) {
				p.record[k] = v
			}
		}
	}
	return p, nil
}

// Paused lists the labels it has paused and not restored, sorted.
func (p *ComponentPauser) Paused() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.record))
	for k := range p.record {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Pause sets each label to ComponentPausedValue, after recording its value. It returns the
// labels it changed now (those already paused by it are left).
func (p *ComponentPauser) Pause(ctx context.Context, labels []string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	node, err := p.live(ctx)
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, k := range labels {
		if !slices.Contains(GPUClientComponents, k) {
			continue
		}
		v, ok := node.Labels[k]
		if ok && v == ComponentPausedValue {
			if _, recorded := p.record[k]; !recorded {
				// Only gpuhealth sets this value, and its record is lost: the operator's own
				// value for a running component is "true".
				on := "true"
				p.record[k] = &on
				if err := p.save(); err != nil {
					return nil, fmt.Errorf("recording the GPU operator's labels: %w", err)
				}
			}
			continue
		}
		if _, recorded := p.record[k]; !recorded {
			if ok {
				p.record[k] = &v
			} else {
				p.record[k] = nil
			}
		}
		changed = append(changed, k)
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := p.save(); err != nil {
		return nil, fmt.Errorf("recording the GPU operator's labels before pausing them: %w", err)
	}
	set := map[string]any{}
	for _, k := range changed {
		set[k] = ComponentPausedValue
	}
	if err := p.patch(ctx, set); err != nil {
		return nil, fmt.Errorf("pausing the GPU operator's components %s: %w", strings.Join(changed, ", "), err)
	}
	return changed, nil
}

// Restore gives every label it paused back the value it recorded, where the label still says
// ComponentPausedValue (someone who changed it since decided otherwise), and forgets the record.
// It returns the labels it restored.
func (p *ComponentPauser) Restore(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.record) == 0 {
		return nil, nil
	}
	node, err := p.live(ctx)
	if err != nil {
		return nil, err
	}
	set := map[string]any{}
	var restored []string
	for k, prev := range p.record {
		if node.Labels[k] != ComponentPausedValue {
			continue
		}
		restored = append(restored, k)
		if prev == nil {
			set[k] = nil
		} else {
			set[k] = *prev
		}
	}
	slices.Sort(restored)
	if len(set) > 0 {
		if err := p.patch(ctx, set); err != nil {
			return nil, fmt.Errorf("restoring the GPU operator's components %s: %w", strings.Join(restored, ", "), err)
		}
	}
	p.record = map[string]*string{}
	if err := p.save(); err != nil {
		return restored, fmt.Errorf("clearing the record of the GPU operator's labels: %w", err)
	}
	return restored, nil
}

func (p *ComponentPauser) live(ctx context.Context) (*corev1.Node, error) {
	n, err := p.client.CoreV1().Nodes().Get(ctx, p.nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", p.nodeName, err)
	}
	return n, nil
}

func (p *ComponentPauser) patch(ctx context.Context, labels map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	_, err = p.client.CoreV1().Nodes().Patch(ctx, p.nodeName, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// save writes the record atomically (nothing to write without a path); an empty record removes
// the file.
func (p *ComponentPauser) save() error {
	if p.path == "" {
		return nil
	}
	if len(p.record) == 0 {
		if err := os.Remove(p.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(pauseRecord{Node: p.nodeName, Labels: p.record})
	if err != nil {
		return err
	}
	return writeFileAtomic(p.path, data)
}

// writeFileAtomic replaces path with data: a crash leaves the old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up after a failure
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
