package sharedcause

import "math"

// exactChooseUpTo is the largest min(k, n-k) for which logChoose sums logs rather than
// subtracting lgammas.
const exactChooseUpTo = 2000

// logBinomialTail returns ln P[X ≥ k] for X ~ Binomial(n, p), summed term by term in log space
// so that neither n in the hundreds of thousands nor a p of 1e-9 overflows or underflows.
//
// The first term comes from lgamma; each next term from the previous one by the ratio
// P[X=i+1]/P[X=i] = (n-i)/(i+1) · p/(1-p). Past the mode the terms fall, and the sum stops when
// a term adds less than e^-45 (3e-20) of it: the tail is then exact to float64 precision.
func logBinomialTail(k, n int, p float64) float64 {
	switch {
	case k <= 0:
		return 0
	case k > n || p <= 0:
		return math.Inf(-1)
	case p >= 1:
		return 0
	}
	lp, lq := math.Log(p), math.Log1p(-p)
	term := logChoose(n, k) + float64(k)*lp + float64(n-k)*lq
	sum := term
	mode := math.Floor(float64(n+1) * p)
	for i := k; i < n; i++ {
		term += math.Log(float64(n-i)) - math.Log(float64(i+1)) + lp - lq
		sum = logAdd(sum, term)
		if float64(i+1) >= mode && term-sum < -45 {
			break
		}
	}
	return min(sum, 0)
}

// logChoose returns ln C(n, k). lgamma(400,001) is about 4.7e6, so the difference of three
// lgammas is only good to about 1e-9; when k or n-k is small (a group's faulty GPUs usually
// are) the product C(n, k) = Π (n-i)/(i+1) is summed in logs instead, to about 1e-13.
func logChoose(n, k int) float64 {
	if m := min(k, n-k); m <= exactChooseUpTo {
		sum := 0.0
		for i := range m {
			sum += math.Log(float64(n-i)) - math.Log(float64(i+1))
		}
		return sum
	}
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// logAdd returns ln(e^a + e^b) without leaving log space.
func logAdd(a, b float64) float64 {
	if a < b {
		a, b = b, a
	}
	if math.IsInf(b, -1) {
		return a
	}
	return a + math.Log1p(math.Exp(b-a))
}
