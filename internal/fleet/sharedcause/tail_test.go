package sharedcause

import (
	"math"
	"math/big"
	"testing"
)

// exactHypergeomTail computes P[X ≥ k], X ~ Hypergeometric(N, K, n), in exact rational arithmetic.
func exactHypergeomTail(k, bigN, bigK, n int64) float64 {
	choose := func(a, b int64) *big.Int {
		if b < 0 || b > a {
			return new(big.Int)
		}
		return new(big.Int).Binomial(a, b)
	}
	sum := new(big.Int)
	for i := k; i <= min(bigK, n); i++ {
		sum.Add(sum, new(big.Int).Mul(choose(bigK, i), choose(bigN-bigK, n-i)))
	}
	f, _ := new(big.Rat).SetFrac(sum, choose(bigN, n)).Float64()
	return f
}

func TestLogHypergeomTailExact(t *testing.T) {
	tests := []struct {
		name       string
		k, N, K, n int
	}{
		{"a lady tasting tea, 4 of 4", 4, 8, 4, 4},
		{"3 of 4", 3, 8, 4, 4},
		{"below the mean", 1, 100, 20, 10},
		{"a rack: 12 faulty of 80, 40 of 4,800", 12, 4800, 40, 80},
		{"a driver: 45 of 160 faulty, 47 of 480", 45, 480, 47, 160},
		{"most of the fleet: 46 of 4,560, 48 of 4,800", 46, 4800, 48, 4560},
		{"rare: 5 of 300, 6 of 30,000", 5, 30000, 6, 300},
		{"every faulty GPU in the group", 20, 2000, 20, 100},
		{"the group is every GPU but one", 30, 100, 30, 99},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := exactHypergeomTail(int64(tc.k), int64(tc.N), int64(tc.K), int64(tc.n))
			got := math.Exp(logHypergeomTail(tc.k, tc.N, tc.K, tc.n))
			if math.Abs(got-want) > 1e-11*want {
				t.Errorf("P[X ≥ %d], X ~ Hypergeom(%d, %d, %d) = %.17g, want %.17g", tc.k, tc.N, tc.K, tc.n, got, want)
			}
		})
	}
}

// TestLogHypergeomTailEdges: the support's ends, and fleet-sized populations against closed
// forms: all K faulty in the group, P = C(n, K)/C(N, K); at least one of the group faulty, P =
// 1 - C(N-K, n)/C(N, n).
func TestLogHypergeomTailEdges(t *testing.T) {
	lnC := func(n, k float64) float64 { // Π (n-i)/(i+1), in logs: exact enough for small k
		sum := 0.0
		for i := 0.0; i < k; i++ {
			sum += math.Log(n-i) - math.Log(i+1)
		}
		return sum
	}
	tests := []struct {
		name       string
		k, N, K, n int
		want       float64 // ln P[X ≥ k]
	}{
		{"none needed", 0, 400_000, 100, 1000, 0},
		{"fewer than the group must hold", 5, 100, 98, 10, 0},
		{"more than K", 11, 400_000, 10, 1000, math.Inf(-1)},
		{"more than n", 11, 400_000, 100, 10, math.Inf(-1)},
		{"all 50 faulty of 400,000 in a group of 1,000", 50, 400_000, 50, 1000, lnC(1000, 50) - lnC(400_000, 50)},
		{"at least one faulty of 8 in a group of 80, of 400,000", 1, 400_000, 8, 80, math.Log(-math.Expm1(lnC(400_000-8, 80) - lnC(400_000, 80)))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := logHypergeomTail(tc.k, tc.N, tc.K, tc.n)
			if got != tc.want && math.Abs(got-tc.want) > 1e-8*math.Max(1, math.Abs(tc.want)) {
				t.Errorf("ln P[X ≥ %d], X ~ Hypergeom(%d, %d, %d) = %.17g, want %.17g", tc.k, tc.N, tc.K, tc.n, got, tc.want)
			}
		})
	}
}

// TestLogHypergeomTailFalls: the tail falls as k grows (but for rounding, 1e-8 in its log, where it is
// all but 1), stays finite and never passes 0, from the bulk of a fleet-sized distribution far
// into its tail.
func TestLogHypergeomTailFalls(t *testing.T) {
	const bigN, bigK, n = 400_000, 4_000, 10_000 // mean 100
	prev := 0.0
	for k := 1; k <= 2000; k++ {
		got := logHypergeomTail(k, bigN, bigK, n)
		if math.IsNaN(got) || math.IsInf(got, 0) || got > 0 || got > prev+1e-8 {
			t.Fatalf("ln P[X ≥ %d] = %v after %v for k-1", k, got, prev)
		}
		prev = got
	}
}
