package sharedcause

import (
	"fmt"
	"math"
	"time"
)

// Defaults of Options; WithDefaults fills a zero field with its default.
const (
	DefaultWindow            = time.Hour
	DefaultMinFaultyGPUs     = 5
	DefaultMinFaultyNodes    = 2
	DefaultMinRatio          = 5.0
	DefaultAlpha             = 0.001
	DefaultSignatureWindow   = 30 * time.Second
	DefaultMinSignatureGPUs  = 4
	DefaultSignatureFraction = 0.5
)

// Options are the judge's parameters; Validate names them as the fleet section of a HealthConfig
// would (window, minFaultyGPUs, ...). The zero value of a field means its default; WithDefaults
// says so explicitly and Validate rejects what no default can mean (a negative window, an alpha
// of 2).
type Options struct {
	// Window is how far back from now a fault counts.
	Window time.Duration
	// MinFaultyGPUs is the fewest faulty GPUs a group needs to be a finding, however unlikely its
	// count: it keeps a handful of faults from ever raising anything.
	MinFaultyGPUs int
	// MinFaultyNodes is the fewest nodes the group's faulty GPUs must be spread over: eight faulty
	// GPUs of one node are that node's problem, not its rack's. 1 turns the rule off.
	MinFaultyNodes int
	// MinRatio is the least factor by which a group's rate must exceed the rest's (the rest's
	// rate continuity-corrected, see the package comment).
	MinRatio float64
	// Alpha is the family-wise false-finding rate of one judgement, split evenly over the groups
	// tested (Bonferroni).
	Alpha float64
	// SignatureWindow is how close in time one workload's faults of one reason must be to be
	// the workload's signature.
	SignatureWindow time.Duration
	// MinSignatureGPUs is the fewest GPUs a workload signature spans.
	MinSignatureGPUs int
	// SignatureFraction is the least fraction of the workload's GPUs a signature spans.
	SignatureFraction float64
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.MinFaultyGPUs == 0 {
		o.MinFaultyGPUs = DefaultMinFaultyGPUs
	}
	if o.MinFaultyNodes == 0 {
		o.MinFaultyNodes = DefaultMinFaultyNodes
	}
	if o.MinRatio == 0 {
		o.MinRatio = DefaultMinRatio
	}
	if o.Alpha == 0 {
		o.Alpha = DefaultAlpha
	}
	if o.SignatureWindow == 0 {
		o.SignatureWindow = DefaultSignatureWindow
	}
	if o.MinSignatureGPUs == 0 {
		o.MinSignatureGPUs = DefaultMinSignatureGPUs
	}
	if o.SignatureFraction == 0 {
		o.SignatureFraction = DefaultSignatureFraction
	}
	return o
}

// Validate reports what makes the options unusable. It judges the options as given: call
// WithDefaults first to give zero fields their defaults (Judge does).
func (o Options) Validate() error {
	switch {
	case o.Window <= 0:
		return fmt.Errorf("window: must be positive, got %v", o.Window)
	case o.MinFaultyGPUs < 1:
		return fmt.Errorf("minFaultyGPUs: must be 1 or more, got %d", o.MinFaultyGPUs)
	case o.MinFaultyNodes < 1:
		return fmt.Errorf("minFaultyNodes: must be 1 or more, got %d", o.MinFaultyNodes)
	case math.IsNaN(o.MinRatio) || math.IsInf(o.MinRatio, 0) || o.MinRatio < 1:
		return fmt.Errorf("minRatio: must be a number of 1 or more, got %v", o.MinRatio)
	case !(o.Alpha > 0 && o.Alpha < 1):
		return fmt.Errorf("alpha: must be above 0 and below 1, got %v", o.Alpha)
	case o.SignatureWindow <= 0:
		return fmt.Errorf("signatureWindow: must be positive, got %v", o.SignatureWindow)
	case o.SignatureWindow > o.Window:
		return fmt.Errorf("signatureWindow: must not be longer than the window (%v), got %v", o.Window, o.SignatureWindow)
	case o.MinSignatureGPUs < 2:
		return fmt.Errorf("minSignatureGPUs: must be 2 or more, got %d", o.MinSignatureGPUs)
	case !(o.SignatureFraction > 0 && o.SignatureFraction <= 1):
		return fmt.Errorf("signatureFraction: must be above 0 and at most 1, got %v", o.SignatureFraction)
	}
	return nil
}
