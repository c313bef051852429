package sharedcause

import "math"

// exactChooseUpTo is the largest min(k, n-k) for which logChoose sums logs rather than
// subtracting lgammas.
const exactChooseUpTo = 2000

// logHypergeomTail returns ln P[X ≥ k] for X ~ Hypergeometric(N, K, n): of N GPUs of which K
// are faulty, n drawn at random (a group), the chance that k or more of them are faulty. It is
// the one-sided p-value of Fisher's exact test of a group against the rest of the fleet: it
// asks nothing of the rest's rate, so a rest that is small, or had no fault by chance, makes no
// group look worse than it is.
//
// It is summed term by term in log space, so that N in the hundreds of thousands and tails far
// below float64's range neither overflow nor underflow. The first term comes from logChoose;
// each next from the previous one by the ratio P[X=i+1]/P[X=i] =
// (K-i)(n-i) / ((i+1)(N-K-n+i+1)). Past the mode the terms fall, and the sum stops when a term
// adds less than e^-45 (3e-20) of it.
func logHypergeomTail(k, bigN, bigK, n int) float64 {
	lo, hi := max(0, n-(bigN-bigK)), min(bigK, n)
	switch {
	case k <= lo:
		return 0
	case k > hi:
		return math.Inf(-1)
	}
	term := logChoose(bigK, k) + logChoose(bigN-bigK, n-k) - logChoose(bigN, n)
	sum := term
	mode := math.Floor(float64(n+1) * float64(bigK+1) / float64(bigN+2))
	for i := k; i < hi; i++ {
		term += math.Log(float64(bigK-i)) + math.Log(float64(n-i)) - math.Log(float64(i+1)) - math.Log(float64(bigN-bigK-n+i+1))
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
