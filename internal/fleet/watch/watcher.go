package watch

import (
	"cmp"
	"context"
	"errors"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Settings are what the Watcher judges by: a HealthConfig's fleet.sharedCauses (SettingsFrom).
type Settings struct {
	// Every is the period between two judgements (default config.DefaultSharedCausesEvery). The
	// configuration allows no less than config.MinSharedCausesEvery; tests may.
	Every time.Duration
	// Labels are the node labels the GPUs are grouped by besides driver, model, NVLink domain and
	// zone.
	Labels []string
	// Judge are the judge's options; zero fields take its defaults.
	Judge sharedcause.Options
}

// SettingsFrom returns the settings of a (validated) fleet.sharedCauses section: the fields it
// leaves unset take the judge's defaults, as `gpuhealth fleet`'s flags do.
func SettingsFrom(c config.SharedCausesConfig) Settings {
	s := Settings{Every: c.Period(), Labels: c.Labels}
	if c.Window != nil {
		s.Judge.Window = time.Duration(*c.Window)
	}
	if c.MinFaultyGPUs != nil {
		s.Judge.MinFaultyGPUs = *c.MinFaultyGPUs
	}
	if c.MinRatio != nil {
		s.Judge.MinRatio = *c.MinRatio
	}
	if c.Alpha != nil {
		s.Judge.Alpha = *c.Alpha
	}
	if w := s.Judge.Window; w > 0 && w < sharedcause.DefaultSignatureWindow {
		s.Judge.SignatureWindow = w // a burst is judged within the faults judged
	}
	return s
}

// Options configure a Watcher. Client and Namespace are required.
type Options struct {
	Settings
	Client kube.Interface
	// Namespace holds the findings ConfigMap (the breaker controller's).
	Namespace string
	// Driver is the DRA driver whose ResourceClaims' devices are GPUs (default
	// config.DefaultDriverName).
	Driver string
	// Clock is the real clock when nil.
	Clock clock.Clock
	// Recorder, when set, posts the Events.
	Recorder EventRecorder
	// Finding, when set, hears each finding that appears (true) or ends (false); Signatures the
	// number of current workload signatures after every verdict (0 when the Watcher stops); Judged
	// the time of every judgement once its verdict is in the ConfigMap (written, or unchanged).
	// For metrics.
	Finding    func(attribute, value string, current bool)
	Signatures func(n int)
	Judged     func(at time.Time)
}

// Watcher judges the fleet every period and publishes the verdict (the package comment says
// how). Run it where one replica leads.
type Watcher struct {
	opts    Options
	pub     publisher
	rep     reporter
	skipped int // nodes whose report could not be read, at the last judgement
	// loaded says the predecessor's verdict was read: its findings are this one's to end.
	loaded bool
}

// New returns a Watcher of opts, its judge's options checked.
func New(opts Options) (*Watcher, error) {
	if opts.Client == nil || opts.Namespace == "" {
		return nil, errors.New("fleet watcher: a client and a namespace are required")
	}
	opts.Every = cmp.Or(opts.Every, config.DefaultSharedCausesEvery)
	opts.Driver = cmp.Or(opts.Driver, config.DefaultDriverName)
	if opts.Every < 0 {
		return nil, errors.New("fleet watcher: the period must be positive")
	}
	if err := opts.Judge.WithDefaults().Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	w := &Watcher{opts: opts, pub: publisher{client: opts.Client, namespace: opts.Namespace}}
	w.rep.opts = &w.opts
	return w, nil
}

// Run judges every period until ctx is done: first once the Nodes (and the pods, if they may be
// listed) are read, then every Settings.Every. A failure is logged and keeps the last verdict.
// On return the metrics' series are removed.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", "fleet-shared-causes")
	ctx = klog.NewContext(ctx, logger)
	c, err := newClusterCache(w.opts.Client, w.opts.Labels, w.opts.Driver)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer c.wait()
	defer cancel()
	defer w.rep.clear()
	if !c.start(ctx) {
		return nil
	}
	for {
		if err := w.round(ctx, c); err != nil && ctx.Err() == nil {
			logger.Error(err, "Judging the fleet failed; keeping the last verdict and retrying next period")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.opts.Clock.After(w.opts.Every):
		}
	}
}

// round reads the cluster from c and judges it.
func (w *Watcher) round(ctx context.Context, c *clusterCache) error {
	in, err := c.read(ctx)
	if err != nil {
		return err
	}
	return w.judge(ctx, w.opts.Clock.Now(), in)
}

// judge judges in at now, publishes the verdict and reports what changed.
func (w *Watcher) judge(ctx context.Context, now time.Time, in Input) error {
	collected := fleet.CollectFrom(in.Nodes, fleet.HoldClaims(in.Pods, in.Claims, in.Devices), w.opts.Labels)
	if n := len(collected.Skipped); n != w.skipped {
		w.skipped = n
		if n > 0 {
			klog.FromContext(ctx).Info("Warning: some nodes' GPU health reports cannot be read; their GPUs are left out",
				"nodes", n, "first", collected.Skipped[:min(n, 5)])
		}
	}
	res, err := sharedcause.Judge(now, collected.Fleet, w.opts.Judge)
	if err != nil {
		return err
	}
	if !w.loaded {
		if err := w.pub.read(ctx); err != nil {
			return err
		}
		if w.pub.lastOK {
			w.rep.seed(w.pub.last)
		}
		w.loaded = true
	}
	f := newFindings(res, len(collected.Skipped), in.PodsErr != nil)
	cm, err := w.pub.publish(ctx, f)
	if err != nil {
		return err
	}
	w.rep.report(ctx, cm, w.pub.last)
	if w.opts.Judged != nil {
		w.opts.Judged(now)
	}
	return nil
}
