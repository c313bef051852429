package sharedcause

import (
	"math"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	valid := Options{}.WithDefaults()
	tests := []struct {
		name   string
		change func(*Options)
		want   string // the error, word for word; "" for none
	}{
		{"defaults", func(*Options) {}, ""},
		{"zero window", func(o *Options) { o.Window = 0 }, "window: must be positive, got 0s"},
		{"negative window", func(o *Options) { o.Window = -time.Minute }, "window: must be positive, got -1m0s"},
		{"min faulty GPUs", func(o *Options) { o.MinFaultyGPUs = -1 }, "minFaultyGPUs: must be 1 or more, got -1"},
		{"min faulty nodes", func(o *Options) { o.MinFaultyNodes = 0 }, "minFaultyNodes: must be 1 or more, got 0"},
		{"ratio below 1", func(o *Options) { o.MinRatio = 0.5 }, "minRatio: must be a number of 1 or more, got 0.5"},
		{"ratio NaN", func(o *Options) { o.MinRatio = math.NaN() }, "minRatio: must be a number of 1 or more, got NaN"},
		{"ratio infinite", func(o *Options) { o.MinRatio = math.Inf(1) }, "minRatio: must be a number of 1 or more, got +Inf"},
		{"alpha 0", func(o *Options) { o.Alpha = 0 }, "alpha: must be above 0 and below 1, got 0"},
		{"alpha 1", func(o *Options) { o.Alpha = 1 }, "alpha: must be above 0 and below 1, got 1"},
		{"alpha NaN", func(o *Options) { o.Alpha = math.NaN() }, "alpha: must be above 0 and below 1, got NaN"},
		{"signature window", func(o *Options) { o.SignatureWindow = -time.Second }, "signatureWindow: must be positive, got -1s"},
		{"signature window past the window", func(o *Options) { o.SignatureWindow = 2 * time.Hour },
			"signatureWindow: must not be longer than the window (1h0m0s), got 2h0m0s"},
		{"one signature GPU", func(o *Options) { o.MinSignatureGPUs = 1 }, "minSignatureGPUs: must be 2 or more, got 1"},
		{"signature fraction 0", func(o *Options) { o.SignatureFraction = 0 }, "signatureFraction: must be above 0 and at most 1, got 0"},
		{"signature fraction above 1", func(o *Options) { o.SignatureFraction = 1.5 }, "signatureFraction: must be above 0 and at most 1, got 1.5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := valid
			tc.change(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	want := Options{
		Window: time.Hour, MinFaultyGPUs: 5, MinFaultyNodes: 2, MinRatio: 5, Alpha: 0.001,
		SignatureWindow: 30 * time.Second, MinSignatureGPUs: 4, SignatureFraction: 0.5,
	}
	if got := (Options{}).WithDefaults(); got != want {
		t.Errorf("Options{}.WithDefaults() = %+v, want %+v", got, want)
	}
	set := Options{Window: time.Minute, MinFaultyGPUs: 3, MinFaultyNodes: 1, MinRatio: 2, Alpha: 0.01,
		SignatureWindow: time.Second, MinSignatureGPUs: 8, SignatureFraction: 1}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults changed set fields: %+v, want %+v", got, set)
	}
}

// TestJudgeRejectsOptions: Judge returns Validate's error, not a judgement.
func TestJudgeRejectsOptions(t *testing.T) {
	_, err := Judge(now, Fleet{GPUs: testFleet()}, Options{Alpha: 2})
	if err == nil || err.Error() != "alpha: must be above 0 and below 1, got 2" {
		t.Errorf("Judge with alpha 2: error %v", err)
	}
}
