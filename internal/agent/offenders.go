package agent

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// offenderCheck reads, when the agent starts, the GPURecord of each of its GPUs' serials (by
// name: the agent may get records, never list or write them) and marks a GPU whose past meets
// the rule a repeat offender. It runs once: a card appears on a node only when the node starts,
// and so does its agent. A verdict is raised once per newest event it counted (remembered in the
// checkpoint with the operators' requests), so that an administrator's clear sticks until the
// card fails again.
type offenderCheck struct {
	records  kube.GPURecordInterface
	rule     gpurecord.RepeatOffenderRule
	devices  []health.Device
	monitor  *health.Monitor
	clock    clock.PassiveClock
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference
}

// offenderRetry is how a record is read again while the API server cannot answer.
var offenderRetry = wait.Backoff{Duration: time.Second, Factor: 2, Steps: 8, Cap: time.Minute}

// run checks every GPU with a serial, then returns.
func (c *offenderCheck) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("check", "repeat-offenders")
	checked := 0
	for _, d := range c.devices {
		if d.Serial == "" || d.MIG != nil || d.Missing {
			continue
		}
		rec, err := c.read(ctx, d.Serial)
		switch {
		case ctx.Err() != nil:
			return nil
		case apierrors.IsForbidden(err):
			logger.Info("Warning: may not read GPU records; repeat offenders are not checked (the agent's ClusterRole lacks get on gpurecords)", "err", err.Error())
			return nil
		case err != nil:
			logger.Error(err, "Reading a GPU's record failed; its past is not checked", "gpu", d.Index, "serial", d.Serial)
			continue
		}
		checked++
		if rec != nil {
			c.judge(ctx, d, rec)
		}
	}
	logger.V(2).Info("Checked the GPUs' records", "gpus", checked)
	return nil
}

// read gets serial's record, retrying while the API server cannot answer; nil when there is
// none (or the CRD is not installed).
func (c *offenderCheck) read(ctx context.Context, serial string) (*gpurecord.GPURecord, error) {
	var rec *gpurecord.GPURecord
	err := wait.ExponentialBackoffWithContext(ctx, offenderRetry, func(ctx context.Context) (bool, error) {
		r, err := c.records.Get(ctx, gpurecord.NameFor(serial), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsInvalid(err):
			return false, err
		case err != nil:
			klog.FromContext(ctx).V(2).Info("Reading a GPU's record failed; retrying", "serial", serial, "err", err.Error())
			return false, nil
		}
		rec = r
		return true, nil
	})
	if errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err) {
		return nil, errors.New("the API server did not answer")
	}
	if rec != nil && rec.Serial != serial {
		return nil, nil // another serial's record by the same name: not this card's past
	}
	return rec, err
}

// judge marks d when its record meets the rule and the verdict was not raised before.
func (c *offenderCheck) judge(ctx context.Context, d health.Device, rec *gpurecord.GPURecord) {
	now := c.clock.Now()
	v := c.rule.Judge(rec, now)
	if !v.Offender {
		return
	}
	key := "repeat-offender/" + d.UUID + "/" + v.Newest.UTC().Format(time.RFC3339Nano)
	if c.monitor.RequestApplied(key) {
		return
	}
	if err := c.monitor.MarkRepeatOffender(d.UUID, v.Message, now); err != nil {
		klog.FromContext(ctx).Error(err, "Marking a repeat offender failed", "gpu", d.Index)
		return
	}
	c.monitor.RememberRequest(key, v.Newest, now)
	klog.FromContext(ctx).Info("A GPU with a past: marked a repeat offender", "gpu", d.Index, "serial", d.Serial, "past", v.Message)
	c.recorder.Eventf(c.nodeRef, corev1.EventTypeWarning, "GPURepeatOffender", "GPU %d: %s", d.Index, v.Message)
}
