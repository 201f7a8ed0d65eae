//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestOpsExpertsPipe checks the streamed kernels (FERRITE_MOE_KERNELS=pipe,
// pipe16, piped and pipe16d: the dynamic ones' counters must be back at 0
// after every call)
// against kernels/ref.Experts within kerneltest.ExpertsTol of max |y|:
// widths that fill whole chunks and row blocks and widths that do not
// (hidden 264 = 256 + 8 columns, inter 72 = 2·32 + 8 rows), experts with
// one slot and with more than a group of 8 (several groups), from
// moeGTFrom tokens up to 512 slots, a token with a bad id (NaN, the others
// unaffected), and forced below moeGTFrom (tiles: 1).
func TestOpsExpertsPipe(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	if b.dev.SmemOptIn < moePipeSmem {
		t.Skipf("the device's blocks take %d bytes of shared memory, the streamed kernels %d", b.dev.SmemOptIn, moePipeSmem)
	}
	rng := rand.New(rand.NewPCG(51, 52))
	for _, s := range []struct{ e, k, hidden, inter int }{{12, 4, 256, 96}, {7, 3, 264, 72}, {40, 8, 512, 256}} {
		ex := randExperts(rng, s.e, s.hidden, s.inter)
		for _, w := range []int{8, 16, 8 | moePipeDyn, 16 | moePipeDyn} {
			b.moe = moeConfig{pipe: w}
			for _, n := range []int{moeGTFrom, 5, 16, 33, moePipeSlots / s.k} {
				if !b.usePipe(n, s.k) {
					t.Fatalf("n=%d, k=%d: the streamed kernels are not used", n, s.k)
				}
				checkExperts(t, b, fmt.Sprintf("pipe%d/%+v/n=%d", w, s, n), ex, n, s.k, rng)
			}
			b.moe = moeConfig{pipe: w, tiles: 1}
			for _, n := range []int{1, 2} {
				checkExperts(t, b, fmt.Sprintf("pipe%d/%+v/tiles/n=%d", w, s, n), ex, n, s.k, rng)
			}
		}
	}
}

// TestOpsExpertsPipeRowExact checks that the streamed kernels give every
// token the bits of a call with that token alone (the one-token kernels),
// and so the register tiles' bits too, with tokens that share experts (up
// to 24 slots of one expert: three groups).
func TestOpsExpertsPipeRowExact(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	if b.dev.SmemOptIn < moePipeSmem {
		t.Skip("the device's blocks lack the shared memory")
	}
	const e, k, hidden, inter, n = 6, 4, 264, 72, 24
	rng := rand.New(rand.NewPCG(61, 62))
	ex := randExperts(rng, e, hidden, inter)
	checkExpertsRowExact(t, b, rng, "", ex, n, k, []moeConfig{{pipe: 8}, {pipe: 8, tiles: 1}, {pipe: 16}, {pipe: 16, tiles: 1},
		{pipe: 8 | moePipeDyn}, {pipe: 16 | moePipeDyn, tiles: 1}}, []int{2, moeGTFrom, 9, n})
}

// TestExpertsClampPipe checks ExpertsClamp on the streamed kernels against
// kernels/ref.ExpertsClamp (the limit must change the result).
func TestExpertsClampPipe(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	b.moe = moeConfig{pipe: 8}
	const e, k, hidden, inter, n, limit = 6, 2, 128, 64, 9, 0.5
	rng := rand.New(rand.NewPCG(71, 72))
	ex := randExperts(rng, e, hidden, inter)
	if !b.usePipe(n, k) {
		t.Skip("the streamed kernels do not run here")
	}
	checkClampMoves(t, b, rng, ex, n, k, hidden, limit)
}
