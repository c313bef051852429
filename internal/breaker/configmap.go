package breaker

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// The breaker's ConfigMap: the cluster's GPU count the controller writes, the acknowledgement an
// operator writes, read by every agent.

// ParseState reads the count and the acknowledgement from the breaker's ConfigMap; a value
// that does not parse counts as absent.
func ParseState(cm *corev1.ConfigMap) (clusterGPUs int, acknowledged time.Time) {
	if n, err := strconv.Atoi(cm.Data[ClusterGPUsKey]); err == nil && n > 0 {
		clusterGPUs = n
	}
	if t, err := time.Parse(time.RFC3339Nano, cm.Data[AcknowledgedAtKey]); err == nil {
		acknowledged = t
	}
	return clusterGPUs, acknowledged
}

// Acknowledge lets the held GPUs through: slots taken before the acknowledgement no longer
// count. Slots are dated by the API server, so the acknowledgement is too: it is written with now
// (the caller's clock) and then again with the time the API server recorded for that write (its
// managedFields entry), when the two differ by a second or more. It returns the time written.
func Acknowledge(ctx context.Context, client kube.Interface, namespace string, now time.Time) (time.Time, error) {
	const manager = "gpuhealth-breaker"
	ack := now.UTC()
	write := func(at time.Time) error {
		return updateConfigMap(ctx, client, namespace, manager, func(data map[string]string) bool {
			data[AcknowledgedAtKey] = at.Format(time.RFC3339Nano)
			return true
		})
	}
	if err := write(ack); err != nil {
		return time.Time{}, err
	}
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return ack, nil // acknowledged at the caller's time
	}
	for _, f := range cm.ManagedFields {
		if f.Manager != manager || f.Time == nil {
			continue
		}
		// The server's time has whole seconds; its end covers every slot it dated before.
		server := f.Time.Add(time.Second - time.Nanosecond).UTC()
		if d := server.Sub(ack); d >= time.Second || d <= -time.Second {
			if err := write(server); err != nil {
				return time.Time{}, err
			}
			ack = server
		}
	}
	return ack, nil
}

// updateConfigMap applies change to the breaker's ConfigMap, creating it if needed; change
// reports whether it changed anything. Conflicts re-read.
func updateConfigMap(ctx context.Context, client kube.Interface, namespace, fieldManager string, change func(map[string]string) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cms := client.CoreV1().ConfigMaps(namespace)
		cm, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuhealth"}}, Data: map[string]string{}}
			if !change(cm.Data) {
				return nil
			}
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: fieldManager})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), ConfigMapName, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if !change(cm.Data) {
			return nil
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: fieldManager})
		return err
	})
}
