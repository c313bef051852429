// Package sharedcause judges what a fleet's GPU faults have in common: a driver version, a
// VBIOS, a model, an NVLink domain, a zone, a rack, whatever the caller names. It is pure: GPUs,
// faults and workloads in, findings out, no clock, no cluster (no k8s.io import); the breaker
// controller, the CLI and the Events build on it.
//
// # What is grouped
//
// Every GPU carries attributes by name ("driver", "vbios", "model", "nvlinkDomain", "zone", a
// topology label such as "rack"). For every attribute and value, the GPUs with that value make
// one group; a GPU without a value for an attribute (absent or "") is in no group of it. Only
// faults in [now-Window, now] on GPUs of the fleet count; the others are counted in
// Result.Ignored. A GPU is faulty when it had at least one counted fault: rates count faulty
// GPUs, not faults, so that a storm of XIDs on one GPU is one faulty GPU.
//
// # Workload signatures, first
//
// A workload (a Job, a PodGroup: the caller's key) whose faults of one reason fall within
// SignatureWindow (30 s) of each other on at least MinSignatureGPUs (4) of its GPUs and at least
// SignatureFraction (half) of them has a signature: its own doing, not as many GPU faults. The
// faults of the burst, and each of its GPUs' later (or earlier) faults of the same reason within
// SignatureWindow of that GPU's own previous (or next) one (the storm that goes on), are
// explained: they are left out of every
// count below, so that one job spread over 18 racks does not make 18 racks look bad, and
// Result.Explained / ExplainedFault tell the verdicts to say "workload signature".
//
// # The test
//
// Of N GPUs, K are faulty. A group of n GPUs with k faulty is a finding when all of these hold:
//
//   - k ≥ MinFaultyGPUs (5): a handful of faults never raises anything;
//   - its faulty GPUs are on at least MinFaultyNodes (2) nodes: one node's GPUs are that node's
//     problem, which the per-node verdicts already judge, not its rack's;
//   - k/n ≥ MinRatio (5) × p, where p is the rate of the rest of the fleet (N-n GPUs, K-k
//     faulty) with a continuity correction of one half, p = (K-k+0.5) / (N-n+1), so that the
//     ratio is finite when the rest had no fault;
//   - Fisher's exact test, one-sided: P[X ≥ k] for X ~ Hypergeometric(N, K, n), the chance that
//     n GPUs drawn at random from the fleet hold k or more of its K faulty ones, is below
//     Alpha / m, with Alpha 0.001 and m the number of groups tested (Bonferroni).
//
// The test conditions on the fleet's faults and asks nothing of the rest's rate: a test of the
// group against the rest's rate as if it were known (a binomial tail) called the larger of two
// models bad in 7 of 200 seeds where every GPU failed at 1% and the smaller model's 240 GPUs had,
// by chance, no fault; Fisher's test raises nothing there (TestLopsidedFleetRaisesNothing).
//
// The tail is summed term by term in log space: the first term from log binomial coefficients
// (summed logs when the smaller side is at most 2,000, good to about 1e-13; lgamma above, good
// to about 1e-9 in the logarithm), each next from the one before, until a term adds less than
// e^-45 of the sum. LogPValue keeps what PValue would underflow.
//
// The groups tested, m, are those that could ever be a finding whatever the faults: at least
// MinFaultyGPUs GPUs and not the whole fleet. A group that holds every GPU has nothing to be
// compared with and is never a finding; so a fleet of one node, or of GPUs all alike, raises
// nothing (nor does a fleet of one node under MinFaultyNodes). Since m depends on the fleet
// alone, Alpha bounds the chance of any false finding in one judgement, as far as GPUs fail
// independently of one another.
//
// Groups nest: a rack whose every node runs the bad driver is a finding beside the driver's,
// each with its own figures. Findings come strongest first: lowest p-value, then highest ratio,
// then attribute and value. Signatures come by workload, first fault, then reason.
//
// # Measured
//
// On a fleet of 600 nodes of 8 GPUs (4,800 GPUs; six attributes: three drivers, four VBIOSes,
// two models, three zones, 30 racks, 150 NVLink domains), a wave of faults on 160 of one driver's
// 1,600 GPUs beside 16 of the other 3,200 (20× the rest's rate) is exactly that one finding under
// each of 200 seeds; the same number of faults (about 350) spread uniformly at random raised 0
// false findings in 200 seeds (38,400 groups tested), and a fleet of 4,560 H100 and 240 A100
// GPUs all failing at 1% or 2% raised 0 in 200 seeds each. The tests in wave_test.go measure all three.
// Judging 400,000 GPUs × 10 attributes with 50,000 faults and 6,250 workloads takes about 0.27 s
// and 45 MB on two cores (BenchmarkJudge400kGPUs).
package sharedcause
