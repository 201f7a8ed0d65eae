//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestOpsExpertsPaths checks Experts against kernels/ref.Experts on every
// path: the grouped GEMV of a slot a pass below moeGTFrom tokens (and up to
// moeFewTokens, and with up to 8 slots of an expert a pass), its
// register-tile form from moeGTFrom to moeGTTokens (every tile size, blocks of one, some and all slots, and
// forced at fewer tokens), the sorted tiled GEMMs above that on CUDA cores
// (experts of mixed dtypes: bf16, f32 and block-scaled F8E4M3, fused and
// separate) and on tensor cores (all bf16, and again with them turned off),
// with experts of one and of several 64-slot tiles and tokens that share
// experts, within kerneltest.ExpertsTol of max |y|.
func TestOpsExpertsPaths(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	b.moe = moeConfig{}
	const e, hidden, inter = 12, 256, 96
	rng := rand.New(rand.NewPCG(31, 32))
	mixed, bf16 := make([]kernels.Expert, e), make([]kernels.Expert, e)
	for i := range e {
		switch i % 4 {
		case 0:
			mixed[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.BF16, 2*inter, hidden, 0, 0)}
		case 1:
			mixed[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0),
				Up: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)}
		case 2:
			mixed[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0),
				Up: kerneltest.NewMat(rng, kernels.F32, inter, hidden, 0, 0)}
		default:
			mixed[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.F8E4M3, inter, hidden, 32, 64),
				Up: kerneltest.NewMat(rng, kernels.F8E4M3, inter, hidden, 32, 64)}
		}
		if i%4 == 3 {
			mixed[i].Down = kerneltest.NewMat(rng, kernels.F8E4M3, hidden, inter, 64, 32)
		} else {
			mixed[i].Down = kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
		}
		if i%2 == 0 {
			bf16[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.BF16, 2*inter, hidden, 0, 0)}
		} else {
			bf16[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0),
				Up: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)}
		}
		bf16[i].Down = kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	}
	for _, n := range []int{1, 2, 3, 8, moeFewTokens + 1, moeGTTokens, moeGTTokens + 1, 300} {
		checkExperts(t, b, fmt.Sprint("mixed/n=", n), mixed, n, 4, rng)
	}
	checkExperts(t, b, "bf16/n=16", bf16, 16, 4, rng) // the register tiles
	for _, c := range []moeConfig{{tiles: 1}, {tiles: 1, sb: 1}, {tiles: 1, sb: 7}, {tiles: 1, sb: 256}, {tiles: 1, gt: 1},
		{tiles: 1, gt: 2, sb: 5}, {gt: 2}, {gt: 1, sb: 3}} {
		b.moe = c
		for _, n := range []int{1, 5, moeFewTokens + 3, moeGTTokens} {
			checkExperts(t, b, fmt.Sprintf("mixed/%+v/n=%d", c, n), mixed, n, 4, rng)
			checkExperts(t, b, fmt.Sprintf("bf16/%+v/n=%d", c, n), bf16, n, 4, rng)
		}
	}
	b.moe = moeConfig{v1: true, slots8: true} // the kernels that take up to 8 slots of an expert a pass
	for _, n := range []int{3, 8} {
		checkExperts(t, b, fmt.Sprint("mixed/8-slot/n=", n), mixed, n, 4, rng)
	}
	b.moe = moeConfig{v1: true} // slot a pass up to moeFewTokens, the sorted tiles above
	for _, n := range []int{moeFewTokens, 20} {
		checkExperts(t, b, fmt.Sprint("mixed/v1/n=", n), mixed, n, 4, rng)
	}
	// Above moeGTTokens the streamed kernels (moePipeAuto); then the sorted
	// tiles they replace there, with FERRITE_MOE_KERNELS=nopipe.
	b.moe = moeConfig{}
	checkExperts(t, b, fmt.Sprint("bf16/n=", moeGTTokens+1), bf16, moeGTTokens+1, 4, rng)
	// hidden 1,040: ferrite_moe_combine splits a token's columns over up to
	// 5 blocks (combineParts), or one (FERRITE_MOE_COMBINE=1).
	wide := randExperts(rng, 8, 1040, 64)
	for _, c := range []moeConfig{{}, {combine1: true}} {
		b.moe = c
		for _, n := range []int{8, moeGTTokens + 1} {
			checkExperts(t, b, fmt.Sprintf("wide/%+v/n=%d", c, n), wide, n, 4, rng)
		}
	}
	b.moe = moeConfig{pipe: -1}
	for _, n := range []int{moeGTTokens + 1, 300} {
		checkExperts(t, b, fmt.Sprint("bf16/mma/n=", n), bf16, n, 4, rng)
		b.noMMA = true
		checkExperts(t, b, fmt.Sprint("bf16/fma/n=", n), bf16, n, 4, rng)
		b.noMMA = false
	}
}

// TestOpsExpertsRowExact checks that the grouped GEMV paths give every
// token the bits of a call with that token alone (kernels.RowExact: a
// speculative verification's rows reproduce plain decoding's): the
// register tiles (every size, with and without the L2 prefetches, at 2 to
// 12 tokens) and the slot-a-pass
// kernels, on experts of mixed dtypes with tokens that share experts.
func TestOpsExpertsRowExact(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	const e, k, hidden, inter, n = 6, 4, 128, 64, 12
	rng := rand.New(rand.NewPCG(41, 42))
	ex := make([]kernels.Expert, e)
	for i := range ex {
		if i%3 == 2 {
			ex[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.F8E4M3, inter, hidden, 32, 64),
				Up: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)}
		} else {
			ex[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.BF16, 2*inter, hidden, 0, 0)}
		}
		ex[i].Down = kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	}
	checkExpertsRowExact(t, b, rng, "", ex, n, k,
		[]moeConfig{{}, {tiles: 1}, {tiles: 1, sb: 5}, {tiles: 1, gt: 1}, {tiles: 1, gt: 2}, {slots8: true}}, []int{2, 8, n})
}

// checkExpertsRowExact runs Experts on n random tokens of k distinct
// experts each, one token a call with the default config, then under each
// of configs at each token count of rows, and fails where a token's output
// differs in a bit from its call alone (kernels.RowExact).
func checkExpertsRowExact(t *testing.T, b *Backend, rng *rand.Rand, name string, ex []kernels.Expert, n, k int, configs []moeConfig, rows []int) {
	t.Helper()
	hidden := ex[0].Down.Rows
	xv, wv := randF32(rng, n*hidden), randF32(rng, n*k)
	ids := make([]int32, n*k)
	for i := range n {
		for j, p := range rng.Perm(len(ex))[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	b.moe = moeConfig{}
	alone := make([]float32, n*hidden)
	for i := range n {
		copy(alone[i*hidden:], expertsOnDevice(t, b, ex, 1, k, xv[i*hidden:(i+1)*hidden], ids[i*k:(i+1)*k], wv[i*k:(i+1)*k]))
	}
	for _, c := range configs {
		b.moe = c
		for _, r := range rows {
			got := expertsOnDevice(t, b, ex, r, k, xv[:r*hidden], ids[:r*k], wv[:r*k])
			differ := 0
			for i, v := range got {
				if math.Float32bits(v) != math.Float32bits(alone[i]) {
					differ++
				}
			}
			if differ > 0 {
				t.Errorf("%s%+v, %d tokens: %d of %d outputs differ from the tokens' calls alone", name, c, r, differ, len(got))
			}
		}
	}
}

// checkBatchBits runs Experts on 100 random tokens of k distinct experts
// each and on their first 40, fails where a token's output differs in a
// bit between the two calls (name starts the message), and returns the 40
// tokens' x, ids, routing weights and outputs.
func checkBatchBits(t *testing.T, b *Backend, name string, ex []kernels.Expert, k int, rng *rand.Rand) (xv []float32, ids []int32, wv, few []float32) {
	t.Helper()
	hidden := ex[0].Down.Rows
	xv, wv, ids = randF32(rng, 100*hidden), randF32(rng, 100*k), make([]int32, 100*k)
	for i := range 100 {
		for j, p := range rng.Perm(len(ex))[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	many := expertsOnDevice(t, b, ex, 100, k, xv, ids, wv)
	xv, ids, wv = xv[:40*hidden], ids[:40*k], wv[:40*k]
	few = expertsOnDevice(t, b, ex, 40, k, xv, ids, wv)
	for i, v := range few {
		if math.Float32bits(v) != math.Float32bits(many[i]) {
			t.Fatalf("%stoken %d output %d = %g among 40 tokens, %g among 100", name, i/hidden, i%hidden, v, many[i])
		}
	}
	return xv, ids, wv, few
}

// expertsOnDevice runs Experts in one step on n tokens x (n, hidden) of k
// experts each (ids, w (n, k)) and returns y (n, hidden).
func expertsOnDevice(t *testing.T, b *Backend, ex []kernels.Expert, n, k int, xv []float32, ids []int32, wv []float32) []float32 {
	t.Helper()
	hidden := ex[0].Down.Rows
	x, w := f32Tensor(t, b, n, hidden, xv), f32Tensor(t, b, n, k, wv)
	it, y := i32Tensor(t, b, n, k, ids), f32Tensor(t, b, n, hidden, make([]float32, n*hidden))
	b.BeginStep()
	b.Experts(y, x, it, w, ex)
	b.EndStep()
	got := make([]float32, n*hidden)
	b.ReadF32(got, y)
	return got
}

// checkExperts runs Experts for n random tokens of k distinct experts each
// and compares it with kernels/ref.Experts. The last token of a call of
// several has an expert id out of range: its row must be NaN and the
// others unaffected.
func checkExperts(t *testing.T, b *Backend, name string, ex []kernels.Expert, n, k int, rng *rand.Rand) {
	t.Helper()
	checkExpertsTol(t, b, name, ex, n, k, rng, kerneltest.ExpertsTol)
}

// checkExpertsTol is checkExperts within tol of max |y|.
func checkExpertsTol(t *testing.T, b *Backend, name string, ex []kernels.Expert, n, k int, rng *rand.Rand, tol float64) {
	t.Helper()
	checkExpertsRounded(t, b, name, ex, n, k, rng, tol, nil, nil)
}

// checkExpertsRounded is checkExpertsTol against ref.ExpertsRounded: x
// rounded by rx, each SwiGLU output by rh (nil: as they are).
func checkExpertsRounded(t *testing.T, b *Backend, name string, ex []kernels.Expert, n, k int, rng *rand.Rand, tol float64,
	rx, rh func([]float32) []float32) {
	t.Helper()
	hidden := ex[0].Down.Rows
	good := max(n-1, 1) // tokens with valid ids
	xv, wv := randF32(rng, n*hidden), randF32(rng, n*k)
	ids := make([]int32, n*k)
	for i := range n {
		for j, p := range rng.Perm(len(ex))[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	if n > 1 {
		ids[(n-1)*k+1] = int32(len(ex) + 3)
	}
	got := expertsOnDevice(t, b, ex, n, k, xv, ids, wv)
	want := make([]float32, good*hidden)
	ref.ExpertsRounded(want, xv[:good*hidden], ids[:good*k], wv[:good*k], good, ex, 0, rx, rh)
	m := 0.0
	for _, v := range want {
		m = max(m, math.Abs(float64(v)))
	}
	worst, at := 0.0, 0
	for i, v := range want {
		if d := math.Abs(float64(got[i]) - float64(v)); !(d <= worst) {
			worst, at = d, i
		}
	}
	t.Logf("%s: max |Δ| %.3g (%.3g of max |y| %.3g) at y[%d][%d]", name, worst, worst/m, m, at/hidden, at%hidden)
	if !(worst <= tol*m) {
		t.Errorf("%s: y[%d][%d] = %g, want %g (tolerance %.3g)", name, at/hidden, at%hidden, got[at], want[at], tol*m)
	}
	if n > 1 {
		for d, v := range got[good*hidden:] {
			if !math.IsNaN(float64(v)) {
				t.Errorf("%s: the token with a bad expert id has y[%d] = %g, want NaN", name, d, v)
				break
			}
		}
	}
}

// BenchmarkMoE times Experts alone on Qwen3-30B-A3B's shape (128 experts
// of 768, top 8, hidden 2048, bf16) for 48 layers a step, each layer its
// own experts (58 GB in all, far more than L2 holds; random, generated on
// the device by the first step) and its own random choice, the step
// replayed as a CUDA graph: n tokens a step, the grouped GEMV up to
// moeGTTokens (the slot-a-pass kernels below moeGTFrom, their register
// tiles from there), the sorted tiles above. Variants: "slot" the
// slot-a-pass kernels where the tiles are the default, "gt" the tiles
// where they are not, "gt=1" the tiles with one gate/up row a warp
// (FERRITE_MOE_GT; 4 by default), "tiles" the prefill path's sorted tiles
// at a register-tile size (FERRITE_MOE_KERNELS=v1), "pipe", "pipe16",
// "piped", "pipe16d" the streamed kernels (FERRITE_MOE_KERNELS of the same
// name: moe_pipe.go) from moeGTFrom tokens, "gt=2" two gate/up rows a
// warp (FERRITE_MOE_GT=2), "combine1" ferrite_moe_combine one block a
// token (FERRITE_MOE_COMBINE=1), "notc" without the tensor-core decode
// kernels (FERRITE_MOE_TC=0; moe_tc.go) where they are the default,
// "tc-u4" their _u4 forms (FERRITE_MOE_TC_U4=1).
// µs/layer is the step over the layers; GB/s
// counts the chosen experts' weight bytes (distinct experts of the step's
// tokens) over the step's wall time, TFLOP/s the slots' multiply-adds.
func BenchmarkMoE(b *testing.B) {
	benchMoE(b, 128, 8, 2048, 768, 48, []int{1, 2, 4, 8, 16, 32, 64, 512}, false)
}

// BenchmarkMoEGLM is BenchmarkMoE on GLM-4.7-Flash's routed experts (64
// of 1,536, top 4, hidden 2048, 46 layers, 55 GB), at its bench's batch
// sizes.
func BenchmarkMoEGLM(b *testing.B) {
	benchMoE(b, 64, 4, 2048, 1536, 46, []int{1, 2, 4, 8, 16, 32, 64}, false)
}

// BenchmarkMoEGLMShared is BenchmarkMoEGLM with GLM-4.7-Flash's shared
// expert folded in as the model runs it on the GPU (kernels.SharedExperts):
// a 65th expert of the same shape, every token's fifth slot. Session 26
// measured the tensor-core decode kernels faster in BenchmarkMoEGLM but
// slower end to end on this model; "/tc" forces them
// (FERRITE_MOE_TC_SHARED=1) where the default keeps them off.
func BenchmarkMoEGLMShared(b *testing.B) {
	benchMoE(b, 64, 4, 2048, 1536, 46, []int{8, 16, 32, 64}, true)
}

// benchMoE times e random bf16 experts of hidden × inter a layer, top k,
// plus a folded shared expert when shared.
func benchMoE(b *testing.B, e, k, hidden, inter, layers int, sizes []int, shared bool) {
	mat := randomMats()
	exs := make([][]kernels.Expert, layers)
	if shared {
		e, k = e+1, k+1 // the shared expert last, every token's last slot
	}
	for l := range exs {
		exs[l] = make([]kernels.Expert, e)
		for i := range exs[l] {
			exs[l][i] = kernels.Expert{Gate: mat(inter, hidden), Up: mat(inter, hidden), Down: mat(hidden, inter), Shared: shared && i == e-1}
		}
	}
	benchMoEExperts(b, exs, k, sizes)
}

// BenchmarkMoEQuant is BenchmarkMoE on experts as a Q4_K_M GGUF of
// Qwen3-30B-A3B holds them (gate and up Q4_K, down Q6_K), kept in their
// blocks on the device: 16 layers (2.4 GB, far more than L2 holds), random
// blocks made on the host.
func BenchmarkMoEQuant(b *testing.B) {
	const e, hidden, inter, layers = 128, 2048, 768, 16
	exs := make([][]kernels.Expert, layers)
	var wg sync.WaitGroup
	for l := range exs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(l), 77))
			exs[l] = make([]kernels.Expert, e)
			for i := range exs[l] {
				exs[l][i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.Q4K, inter, hidden, 0, 0),
					Up:   kerneltest.NewMat(rng, kernels.Q4K, inter, hidden, 0, 0),
					Down: kerneltest.NewMat(rng, kernels.Q6K, hidden, inter, 0, 0)}
			}
		})
	}
	wg.Wait()
	benchMoEExperts(b, exs, 8, []int{1, 8, 32, 512})
}

// benchMoEExperts times Experts over the layers' experts exs (one list a
// layer, all of one shape) for each token count in sizes, k experts a
// token, and the variants of the paths that apply there.
func benchMoEExperts(b *testing.B, exs [][]kernels.Expert, k int, sizes []int) {
	be := openOps(b)
	layers, e := len(exs), len(exs[0])
	hidden, inter := exs[0][0].Down.Rows, exs[0][0].Down.Cols
	quant := exs[0][0].Down.DType.Quantized()
	expertBytes := 0 // one expert's weight bytes
	for _, m := range []*kernels.Mat{exs[0][0].Gate, exs[0][0].Up, exs[0][0].Down} {
		expertBytes += m.Rows * m.DType.RowBytes(m.Cols)
	}
	shared := exs[0][e-1].Shared // a folded shared expert: every token's last slot
	routed, nShared := e, 0
	if shared {
		routed, nShared = e-1, 1
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range sizes {
		x := f32Tensor(b, be, n, hidden, randF32(rng, n*hidden))
		y := f32Tensor(b, be, n, hidden, make([]float32, n*hidden))
		ids := make([]kernels.Tensor, layers)
		ws := make([]kernels.Tensor, layers)
		distinct := 0
		for l := range layers {
			v := make([]int32, n*k)
			used := map[int32]bool{}
			for i := range n {
				if shared { // k − 1 routed experts, then the shared one
					v[i*k+k-1] = int32(e - 1)
					used[int32(e-1)] = true
				}
				for j, p := range rng.Perm(routed)[:k-nShared] {
					v[i*k+j] = int32(p)
					used[int32(p)] = true
				}
			}
			distinct += len(used)
			ids[l] = i32Tensor(b, be, n, k, v)
			ws[l] = f32Tensor(b, be, n, k, randF32(rng, n*k))
		}
		step := func() {
			be.BeginStep()
			for l := range layers {
				be.Experts(y, x, ids[l], ws[l], exs[l])
			}
			be.EndStep()
		}
		type variant struct {
			name string
			c    moeConfig
		}
		// The default (the tensor-core decode kernels from moeTCFrom
		// tokens); "/notc" keeps them off, "/tc" takes them below
		// moeTCFrom, and the other variants name their own paths.
		def := moeConfig{tc: moeTCTokens, tcFrom: moeTCFrom}
		vs := []variant{{"", def}}
		if shared && !quant && def.useTC(n) {
			forced := def
			forced.tcShared = true
			vs = append(vs, variant{"/tc", forced})
		} else if tc := (moeConfig{tc: moeTCTokens}); !quant && tc.useTC(n) {
			if def.useTC(n) {
				vs = append(vs, variant{"/notc", moeConfig{}})
			} else { // below moeTCFrom: the kernels where the default keeps them off
				vs = append(vs, variant{"/tc", tc})
			}
			vs = append(vs, variant{"/tc-u4", moeConfig{tc: moeTCTokens, tcU4: true}})
		}
		if quant && n <= moeFewTokens { // the slot-a-pass kernels are their default there
			vs = append(vs, variant{"/q1", moeConfig{q1: true}})
		}
		if n*k <= moeGEMVSlots && n <= moeGTTokens {
			if (moeConfig{}).useGT(n, k) {
				if n <= moeFewTokens {
					vs = append(vs, variant{"/slot", moeConfig{v1: true}})
				} else {
					vs = append(vs, variant{"/tiles", moeConfig{v1: true}})
				}
			} else {
				vs = append(vs, variant{"/gt", moeConfig{tiles: 1}})
			}
		}
		if n > 1 && n <= moeFewTokens && n*k <= moeGEMVSlots {
			vs = append(vs, variant{"/gt=1", moeConfig{tiles: 1, gt: 1}}, variant{"/slot8", moeConfig{v1: true, slots8: true}})
			if quant {
				vs = append(vs, variant{"/gt", moeConfig{tiles: 1}})
			}
		}
		if (moeConfig{}).useGT(n, k) {
			vs = append(vs, variant{"/gt=2", moeConfig{gt: 2}}, variant{"/combine1", moeConfig{combine1: true}})
		}
		if n > moeGTTokens && n*k <= moePipeSlots {
			vs = append(vs, variant{"/tiles", moeConfig{pipe: -1}})
		}
		if n >= moeGTFrom && n*k <= moePipeSlots {
			vs = append(vs, variant{"/pipe", moeConfig{pipe: 8}}, variant{"/pipe16", moeConfig{pipe: 16}},
				variant{"/piped", moeConfig{pipe: 8 | moePipeDyn}}, variant{"/pipe16d", moeConfig{pipe: 16 | moePipeDyn}})
		}
		for _, v := range vs {
			be.moe = v.c
			b.Run(fmt.Sprint("n=", n, v.name), func(b *testing.B) {
				sec := timeSteps(b, be, step)
				bytes := float64(distinct) * float64(expertBytes)
				b.ReportMetric(sec*1e3, "ms/step")
				b.ReportMetric(sec*1e6/float64(layers), "µs/layer")
				b.ReportMetric(bytes/sec/1e9, "GB/s")
				b.ReportMetric(float64(layers*n*k)*3*2*float64(hidden*inter)/sec/1e12, "TFLOP/s")
			})
		}
		be.moe = moeConfig{}
	}
}

// timeSteps runs step twice (the second is captured as a CUDA graph),
// then b.N times, and returns the mean host wall time of those.
func timeSteps(b *testing.B, be *Backend, step func()) float64 {
	step()
	step()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	sec := time.Since(start).Seconds() / float64(b.N)
	if err := be.Err(); err != nil {
		b.Fatal(err)
	}
	return sec
}

// randomMats returns a maker of random bf16 weights without host data
// (kernels.Mat.Random, magnitude about 1/√cols as engine/randweights
// makes them): the backend generates each on the device when a step first
// uses it, alone or stacked.
func randomMats() func(rows, cols int) *kernels.Mat {
	seed := uint64(100)
	return func(rows, cols int) *kernels.Mat {
		seed++
		top := int(math.Floor(-0.5*math.Log2(float64(cols)))) + 1
		return &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols, Random: &kernels.RandomFill{Seed: seed, Top: top}}
	}
}

// BenchmarkOpsDecodeStep30BA3B times a whole batch-1 decode step of
// Qwen3-30B-A3B (hidden 2048, 48 layers, 32/4 heads of 128, 128 experts of
// 768 with fused gate/up, top 8 renormalised, vocabulary 151936) through
// the op set as engine/gqa issues it (q/k/v as one LinearCat, then
// PrepareQKV), no engine: random bf16 weights made on the device (61 GB),
// 512 cached positions in a bf16 KV cache, the step replayed as a CUDA
// graph. "moe" runs only each layer's router, Route and Experts, "attn"
// everything else. ms/step is host wall time from BeginStep to the end of
// EndStep; GB/s counts the weight bytes a step reads (the experts its
// routing chose, distinct per layer).
func BenchmarkOpsDecodeStep30BA3B(b *testing.B) {
	be := openOps(b)
	const hidden, heads, kvHeads, hd, experts, topK, inter, vocab, layers, ctx = 2048, 32, 4, 128, 128, 8, 768, 151936, 48, 512
	mat := randomMats()
	type layer struct {
		q, k, v, o, router *kernels.Mat
		ex                 []kernels.Expert
		kc, vc             kernels.Tensor
	}
	rng := rand.New(rand.NewPCG(7, 8))
	vec := func(n int, v float32) kernels.Tensor {
		s := make([]float32, n)
		for i := range s {
			s[i] = v * (1 + float32(i%7)*0.01)
		}
		return f32Tensor(b, be, 1, n, s)
	}
	ls := make([]layer, layers)
	for i := range ls {
		l := &ls[i]
		l.q, l.k, l.v, l.o = mat(heads*hd, hidden), mat(kvHeads*hd, hidden), mat(kvHeads*hd, hidden), mat(hidden, heads*hd)
		l.router = mat(experts, hidden)
		l.ex = make([]kernels.Expert, experts)
		for e := range l.ex {
			l.ex[e] = kernels.Expert{GateUp: mat(2*inter, hidden), Down: mat(hidden, inter)}
		}
		for j, t := range []*kernels.Tensor{&l.kc, &l.vc} {
			var err error
			if *t, err = be.Alloc(kernels.BF16, ctx, kvHeads*hd); err == nil {
				tb, _ := t.Buffer()
				err = be.dev.FillBF16(tb.(*tensorBuf).buf, int64(ctx*kvHeads*hd), uint64(2*i+j), 1)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	head := mat(vocab, hidden)
	norm, qkNorm := vec(hidden, 1), vec(hd, 1)
	inv := make([]float32, hd/2)
	for i := range inv {
		inv[i] = float32(math.Pow(1e6, -float64(2*i)/hd))
	}
	rope := &kernels.Rotary{InvFreq: f32Tensor(b, be, 1, hd/2, inv), Dim: hd, Scale: 1}
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 1 / float32(math.Sqrt(hd))}
	hn := &kernels.HeadNorm{W: qkNorm, Eps: 1e-6}
	router := &kernels.Router{Scoring: kernels.SoftmaxScoring, TopK: topK, NormTopK: true, Scale: 1}
	const bs = 16
	table := make([]int32, ctx/bs)
	for i := range table {
		table[i] = int32(i)
	}
	p := &kernels.Paged{Pos: i32Tensor(b, be, 1, 1, []int32{ctx - 1}), Seq: i32Tensor(b, be, 1, 1, []int32{0}),
		Slot: i32Tensor(b, be, 1, 1, []int32{ctx - 1}), Blocks: i32Tensor(b, be, 1, ctx/bs, table), BlockSize: bs}
	x0 := randF32(rng, hidden)
	for _, c := range []struct {
		name      string
		attn, moe bool
	}{{"all", true, true}, {"moe", false, true}, {"attn", true, false}} {
		step := func() {
			be.BeginStep()
			x, h, y := be.Scratch(kernels.F32, 1, hidden), be.Scratch(kernels.F32, 1, hidden), be.Scratch(kernels.F32, 1, hidden)
			qkv, q := be.Scratch(kernels.F32, 1, (heads+2*kvHeads)*hd), be.Scratch(kernels.F32, 1, heads*hd)
			o, logits := be.Scratch(kernels.F32, 1, heads*hd), be.Scratch(kernels.F32, 1, vocab)
			rl := be.Scratch(kernels.F32, 1, experts)
			ids, w := be.Scratch(kernels.I32, 1, topK), be.Scratch(kernels.F32, 1, topK)
			be.exec(func(d *Device) error { return d.uploadL(dptr(x), f32Bytes(x0)) })
			be.RMSNorm(h, x, norm, 1e-6, false)
			for _, l := range ls {
				if c.attn {
					be.LinearCat(qkv, h, []*kernels.Mat{l.q, l.k, l.v}, kernels.Epilogue{})
					be.PrepareQKV(q, l.kc, l.vc, qkv, hn, hn, rope, p, shape)
					be.Attention(o, q, l.kc, l.vc, p, shape)
					be.Linear(y, o, l.o, kernels.Epilogue{})
					be.AddRMSNorm(h, x, y, norm, 1e-6, false)
				}
				if c.moe {
					be.Linear(rl, h, l.router, kernels.Epilogue{})
					be.Route(ids, w, rl, router)
					be.Experts(y, h, ids, w, l.ex)
					be.AddRMSNorm(h, x, y, norm, 1e-6, false)
				}
			}
			be.Linear(logits, h, head, kernels.Epilogue{})
			be.EndStep()
		}
		b.Run(c.name, func(b *testing.B) {
			sec := timeSteps(b, be, step)
			bytes := float64(vocab) * hidden * 2
			if c.attn {
				bytes += float64(layers) * (2*heads*hd + 2*kvHeads*hd) * hidden * 2
			}
			if c.moe {
				bytes += float64(layers) * (experts*hidden + topK*3*inter*hidden) * 2
			}
			b.ReportMetric(sec*1e3, "ms/step")
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(bytes/sec/1e9, "GB/s")
		})
	}
}

// TestMoEKernelResources logs the registers and spills of the MoE kernels
// (what limits their blocks an SM; a spill is slow, not wrong).
func TestMoEKernelResources(t *testing.T) {
	b := openOps(t)
	for _, name := range kernelNames {
		if !strings.HasPrefix(name, "ferrite_moe_") && name != "ferrite_route" {
			continue
		}
		regs, local, err := b.dev.kernelResources(name)
		if err != nil {
			t.Skip(err)
		}
		t.Logf("%-32s %3d registers, %4d bytes of local memory a thread, %d blocks of 256 an SM by registers",
			name, regs, local, 65536/max(1, 256*regs))
	}
}
