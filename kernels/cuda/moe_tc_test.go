//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestMoETCRoute checks which calls take the tensor-core decode kernels
// (moe_tc.go), without a GPU: FERRITE_MOE_TC's default, its token bounds
// and 0 (off), FERRITE_MOE_TC_FROM, FERRITE_MOE_TC_SHARED,
// FERRITE_MOE_TC_U4, the row-exact mode, x's alignment and a folded shared
// expert.
func TestMoETCRoute(t *testing.T) {
	t.Setenv("FERRITE_MOE_TC", "")
	if c := moeConfigFromEnv(); c.tc != moeTCTokens {
		t.Errorf("FERRITE_MOE_TC unset: tc = %d, want %d", c.tc, moeTCTokens)
	}
	for v, want := range map[string]int{"0": 0, "64": 64, "x": moeTCTokens, "-3": moeTCTokens} {
		t.Setenv("FERRITE_MOE_TC", v)
		if c := moeConfigFromEnv(); c.tc != want {
			t.Errorf("FERRITE_MOE_TC=%s: tc = %d, want %d", v, c.tc, want)
		}
	}
	t.Setenv("FERRITE_MOE_TC", "")
	for v, want := range map[string]int{"": moeTCFrom, "8": 8, "0": moeTCFrom, "x": moeTCFrom} {
		t.Setenv("FERRITE_MOE_TC_FROM", v)
		if c := moeConfigFromEnv(); c.tcFrom != want {
			t.Errorf("FERRITE_MOE_TC_FROM=%q: tcFrom = %d, want %d", v, c.tcFrom, want)
		}
	}
	t.Setenv("FERRITE_MOE_TC_FROM", "")
	if c := moeConfigFromEnv(); c.tcShared {
		t.Error("FERRITE_MOE_TC_SHARED unset: the tensor-core kernels take a folded shared expert")
	}
	t.Setenv("FERRITE_MOE_TC_SHARED", "1")
	if c := moeConfigFromEnv(); !c.tcShared {
		t.Error("FERRITE_MOE_TC_SHARED=1 not read")
	}
	t.Setenv("FERRITE_MOE_TC_SHARED", "")
	t.Setenv("FERRITE_MOE_TC_U4", "1")
	if c := moeConfigFromEnv(); !c.tcU4 || c.tc != moeTCTokens {
		t.Errorf("FERRITE_MOE_TC_U4=1: %+v, want the _u4 forms", c)
	}
	b := &Backend{moe: moeConfig{tc: moeTCTokens, tcFrom: moeTCFrom}}
	x := func(n, stride int, p uint64) kernels.Tensor {
		return kernels.NewTensor(&tensorBuf{ptr: p, elems: n * stride}, kernels.F32, n, 256, stride, 0)
	}
	routed := make([]kernels.Expert, 4)
	for _, c := range []struct {
		n, stride int
		p         uint64
		want      bool
	}{{moeTCFrom - 1, 256, 4096, false}, {moeTCFrom, 256, 4096, true}, {32, 256, 4096, true}, {moeTCTokens, 260, 4096, true},
		{moeTCTokens + 1, 256, 4096, false}, {32, 258, 4096, false}, {32, 256, 4104, false}} {
		if got := b.tcFits(x(c.n, c.stride, c.p), c.n, routed); got != c.want {
			t.Errorf("tcFits(%d tokens, stride %d, at %#x) = %v, want %v", c.n, c.stride, c.p, got, c.want)
		}
	}
	shared := append(routed, kernels.Expert{Shared: true})
	if b.tcFits(x(32, 256, 4096), 32, shared) {
		t.Error("experts with a folded shared expert take the tensor-core decode kernels")
	}
	b.moe.tcShared = true
	if !b.tcFits(x(32, 256, 4096), 32, shared) {
		t.Error("FERRITE_MOE_TC_SHARED=1: experts with a folded shared expert keep off the tensor-core decode kernels")
	}
	b.moe.tcShared = false
	b.moe.tcFrom = 0 // a config made in a test: from the kernels' fewest
	if !b.tcFits(x(moeTCMin, 256, 4096), moeTCMin, routed) || b.tcFits(x(moeTCMin-1, 256, 4096), moeTCMin-1, routed) {
		t.Errorf("tcFrom 0: the kernels do not start at %d tokens", moeTCMin)
	}
	b.SetRowExact(true)
	if b.tcFits(x(32, 256, 4096), 32, routed) {
		t.Error("the row-exact mode takes the tensor-core decode kernels")
	}
	b.SetRowExact(false)
	b.moe.tc = 0
	if b.tcFits(x(32, 256, 4096), 32, routed) {
		t.Error("FERRITE_MOE_TC=0 takes the tensor-core decode kernels")
	}
}

// TestExpertsTC runs bf16 experts (fused and separate gate/up) through the
// tensor-core decode kernels (and their _u4 forms) at every kind of token
// count — one B tile, several, an expert's slots in more than one 32-slot
// pass and in two 64-slot tiles, the most tokens — within kerneltest.ExpertsTol of
// kernels/ref.Experts (a token with a bad expert id gets NaN); a token's
// bits are the same among 40 tokens and 100; other bits than the register
// tiles' (so the kernels ran); and in the row-exact mode the tokens' bits
// alone.
func TestExpertsTC(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	const e, k, hidden, inter = 12, 4, 256, 96
	rng := rand.New(rand.NewPCG(121, 122))
	ex := randExperts(rng, e, hidden, inter)
	b.moe = moeConfig{tc: moeTCTokens}
	for _, n := range []int{moeTCMin, 9, moeGTTokens, 40, 100, moeTCTokens} {
		checkExperts(t, b, fmt.Sprint("tc/n=", n), ex, n, k, rng)
	}
	// One expert chosen by every token: 100 slots, two tiles, the first in
	// two passes.
	hot := make([]kernels.Expert, 3)
	copy(hot, ex[:3])
	checkExperts(t, b, "tc/3 experts/n=100", hot, 100, 3, rng)
	b.moe.tcU4 = true // the _u4 forms: hidden 256 is 2 chunks of 4, inter 96 one of 3
	for _, n := range []int{9, 100} {
		checkExperts(t, b, fmt.Sprint("tc-u4/n=", n), ex, n, k, rng)
	}
	checkExperts(t, b, "tc-u4/3 experts/n=100", hot, 100, 3, rng)
	b.moe.tcU4 = false
	xv, ids, wv, few := checkBatchBits(t, b, "", ex, k, rng)
	b.moe = moeConfig{} // the register tiles
	tiles, differ := expertsOnDevice(t, b, ex, 40, k, xv, ids, wv), 0
	for i, v := range few {
		if math.Float32bits(v) != math.Float32bits(tiles[i]) {
			differ++
		}
	}
	t.Logf("40 tokens: %d of %d outputs differ in bits from the register tiles'", differ, len(few))
	if differ == 0 {
		t.Error("the tensor-core decode kernels gave the register tiles' bits everywhere: did they run?")
	}
	b.SetRowExact(true)
	defer b.SetRowExact(false)
	checkExpertsRowExact(t, b, rng, "row-exact ", ex, 12, k, []moeConfig{{tc: moeTCTokens}}, []int{moeTCMin, 12})
}
