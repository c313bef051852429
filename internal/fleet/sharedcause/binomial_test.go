package sharedcause

import (
	"math"
	"math/big"
	"testing"
)

// exactTail computes P[X ≥ k] for X ~ Binomial(n, num/den) in exact rational arithmetic.
func exactTail(k, n int, num, den int64) float64 {
	p, q := big.NewRat(num, den), big.NewRat(den-num, den)
	sum := new(big.Rat)
	for i := k; i <= n; i++ {
		term := new(big.Rat).SetInt(new(big.Int).Binomial(int64(n), int64(i)))
		term.Mul(term, ratPow(p, i))
		term.Mul(term, ratPow(q, n-i))
		sum.Add(sum, term)
	}
	f, _ := sum.Float64()
	return f
}

func ratPow(r *big.Rat, e int) *big.Rat {
	num := new(big.Int).Exp(r.Num(), big.NewInt(int64(e)), nil)
	den := new(big.Int).Exp(r.Denom(), big.NewInt(int64(e)), nil)
	return new(big.Rat).SetFrac(num, den)
}

func TestLogBinomialTailExact(t *testing.T) {
	tests := []struct {
		name     string
		k, n     int
		num, den int64
	}{
		{"fair coin, 8 of 10", 8, 10, 1, 2},
		{"fair coin, all 10", 10, 10, 1, 2},
		{"one in ten, 5 of 20", 5, 20, 1, 10},
		{"below the mean", 2, 20, 1, 4},
		{"at the mode", 25, 100, 1, 4},
		{"rare, 5 of 300", 5, 300, 1, 1000},
		{"very rare, 12 of 300", 12, 300, 1, 1000},
		{"likely, 290 of 300", 290, 300, 99, 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := exactTail(tc.k, tc.n, tc.num, tc.den)
			got := math.Exp(logBinomialTail(tc.k, tc.n, float64(tc.num)/float64(tc.den)))
			if math.Abs(got-want) > 1e-12*want {
				t.Errorf("P[X ≥ %d], X ~ Bin(%d, %d/%d) = %.17g, want %.17g", tc.k, tc.n, tc.num, tc.den, got, want)
			}
		})
	}
}

// TestLogBinomialTailLarge checks fleet-sized n against closed forms: P[X ≥ 1] = 1-(1-p)^n and
// P[X ≥ n] = p^n, the latter far below float64's range.
func TestLogBinomialTailLarge(t *testing.T) {
	tests := []struct {
		name string
		k, n int
		p    float64
		want float64 // ln P[X ≥ k]
	}{
		{"at least one of 400,000 at 1e-5", 1, 400_000, 1e-5, math.Log(-math.Expm1(400_000 * math.Log1p(-1e-5)))},
		{"at least one of 400,000 at 1e-12", 1, 400_000, 1e-12, math.Log(-math.Expm1(400_000 * math.Log1p(-1e-12)))},
		{"all 400,000 at 0.01", 400_000, 400_000, 0.01, 400_000 * math.Log(0.01)},
		{"all 50,000 at 1e-9", 50_000, 50_000, 1e-9, 50_000 * math.Log(1e-9)},
		{"half of 400,000 at one half (lgamma)", 200_000, 400_000, 0.5,
			math.Log(0.5 + 0.5*math.Sqrt(2/(math.Pi*400_000))*(1-1.0/(4*400_000)))},
		{"none needed", 0, 400_000, 1e-9, 0},
		{"more than n", 11, 10, 0.5, math.Inf(-1)},
		{"p of 0", 1, 10, 0, math.Inf(-1)},
		{"p of 1", 10, 10, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := logBinomialTail(tc.k, tc.n, tc.p)
			if got != tc.want && math.Abs(got-tc.want) > 1e-9*math.Max(1, math.Abs(tc.want)) {
				t.Errorf("ln P[X ≥ %d], X ~ Bin(%d, %g) = %.17g, want %.17g", tc.k, tc.n, tc.p, got, tc.want)
			}
		})
	}
}

// TestLogBinomialTailFalls: the tail falls as k grows, stays finite and never passes 0, from
// the bulk of a fleet-sized binomial far into its tail.
func TestLogBinomialTailFalls(t *testing.T) {
	const n, p = 400_000, 2.5e-4 // mean 100
	prev := 0.0
	for k := 1; k <= 2000; k++ {
		got := logBinomialTail(k, n, p)
		if math.IsNaN(got) || math.IsInf(got, 0) || got > 0 || got > prev {
			t.Fatalf("ln P[X ≥ %d] = %v after %v for k-1", k, got, prev)
		}
		prev = got
	}
}
