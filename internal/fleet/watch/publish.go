package watch

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// publisher writes the verdict into the ConfigMap when it changed (or every RefreshEvery).
type publisher struct {
	client    kube.Interface
	namespace string
	// cm is the ConfigMap as last read or written; nil: read it first (at the start, and after a
	// failed write, which may have been a conflict with another writer).
	cm *corev1.ConfigMap
	// last is the verdict cm holds, as written (valid while cm is not nil and lastOK).
	last   Findings
	lastOK bool
}

// publish writes f unless cm already says the same and was written less than RefreshEvery ago,
// and returns the ConfigMap (for Events).
func (p *publisher) publish(ctx context.Context, f Findings) (*corev1.ConfigMap, error) {
	data, err := f.encode()
	if err != nil {
		return nil, err
	}
	if p.cm == nil {
		if err := p.read(ctx); err != nil {
			return nil, err
		}
	}
	if p.cm != nil && p.lastOK && sameVerdict(f, p.last) && f.JudgedAt.Sub(p.last.JudgedAt) < RefreshEvery {
		return p.cm, nil
	}
	cms := p.client.CoreV1().ConfigMaps(p.namespace)
	var out *corev1.ConfigMap
	if p.cm == nil {
		out, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: p.namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuhealth-breaker-controller"}},
			Data: map[string]string{FindingsKey: string(data)},
		}, metav1.CreateOptions{})
	} else {
		cm := p.cm.DeepCopy()
		cm.Data = map[string]string{FindingsKey: string(data)}
		out, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		p.cm = nil
		return nil, fmt.Errorf("write ConfigMap %s/%s: %w", p.namespace, ConfigMapName, err)
	}
	klog.FromContext(ctx).V(2).Info("Published the fleet's verdict", "configMap", klog.KObj(out), "sharedCauses", len(f.SharedCauses),
		"signatures", len(f.Signatures), "bytes", len(data))
	p.cm, p.last, p.lastOK = out, f, true
	return out, nil
}

// read reads the ConfigMap and the verdict it holds (a previous leader's): an unchanged verdict
// is not written again.
func (p *publisher) read(ctx context.Context) error {
	cm, err := p.client.CoreV1().ConfigMaps(p.namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		p.cm, p.lastOK = nil, false
		return nil
	case err != nil:
		return fmt.Errorf("read ConfigMap %s/%s: %w", p.namespace, ConfigMapName, err)
	}
	p.cm = cm
	p.last, err = ParseFindings(cm)
	p.lastOK = err == nil
	return nil
}
