//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestOpsExpertsB1 checks ferrite_moe_b1 (FERRITE_MOE_B1, both modes)
// against kernels/ref.Experts and ExpertsClamp at 1 to 3 tokens: widths of
// whole and partial 256-column strides, hidden wider than one load batch,
// tokens that share experts, a token with an id out of range (its row NaN,
// the others unaffected); and that the calls took the kernel.
func TestOpsExpertsB1(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	rng := rand.New(rand.NewPCG(51, 52))
	for _, sh := range []struct{ e, k, hidden, inter int }{
		{12, 4, 256, 96}, {8, 3, 264, 512}, {6, 4, 2304, 264}, {5, 5, 512, 768},
	} {
		ex := randExperts(rng, sh.e, sh.hidden, sh.inter)
		for _, mode := range []int{moeB1Fused, moeB1Two} {
			b.moe = moeConfig{b1: mode}
			for n := 1; n <= moeB1Tokens; n++ {
				name := fmt.Sprintf("b1=%d/e=%d/k=%d/%dx%d/n=%d", mode, sh.e, sh.k, sh.inter, sh.hidden, n)
				x := f32Tensor(t, b, n, sh.hidden, make([]float32, n*sh.hidden))
				if !b.b1Fits(x, n, sh.k, ex) {
					t.Fatalf("%s: ferrite_moe_b1 does not take the call", name)
				}
				checkExperts(t, b, name, ex, n, sh.k, rng)
				checkExpertsClamp(t, b, name+"/clamp", ex, n, sh.k, 0.5, rng)
			}
		}
	}
}

// checkExpertsClamp is checkExperts for ExpertsClamp (every id valid).
func checkExpertsClamp(t *testing.T, b *Backend, name string, ex []kernels.Expert, n, k int, limit float32, rng *rand.Rand) {
	t.Helper()
	hidden := ex[0].Down.Rows
	xv, wv := randF32(rng, n*hidden), randF32(rng, n*k)
	ids := make([]int32, n*k)
	for i := range n {
		for j, p := range rng.Perm(len(ex))[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	x, w := f32Tensor(t, b, n, hidden, xv), f32Tensor(t, b, n, k, wv)
	it, y := i32Tensor(t, b, n, k, ids), f32Tensor(t, b, n, hidden, make([]float32, n*hidden))
	b.BeginStep()
	b.ExpertsClamp(y, x, it, w, ex, limit)
	b.EndStep()
	got := make([]float32, n*hidden)
	b.ReadF32(got, y)
	want := make([]float32, n*hidden)
	ref.ExpertsClamp(want, xv, ids, wv, n, ex, limit)
	m, worst := 0.0, 0.0
	for i, v := range want {
		m = max(m, math.Abs(float64(v)))
		if d := math.Abs(float64(got[i]) - float64(v)); !(d <= worst) {
			worst = d
		}
	}
	if !(worst <= kerneltest.ExpertsTol*m) {
		t.Errorf("%s: max |Δ| %.3g, tolerance %.3g", name, worst, kerneltest.ExpertsTol*m)
	}
}

// TestOpsExpertsB1Exact checks that ferrite_moe_b1 gives the bits of the
// kernels it stands beside (kernels.RowExact): at 1 to 3 tokens (tokens
// sharing experts) the slot-a-pass kernels' bits, in every mode, with and
// without a clamp; and each token alone through it the bits of its row in
// calls of 2 to 12 tokens through the register tiles and the slot-a-pass
// kernels (what a speculative verification's rows run).
func TestOpsExpertsB1Exact(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	const e, k, hidden, inter, n = 6, 4, 512, 768, 12
	rng := rand.New(rand.NewPCG(61, 62))
	ex := randExperts(rng, e, hidden, inter)
	xv, wv := randF32(rng, n*hidden), randF32(rng, n*k)
	ids := make([]int32, n*k)
	for i := range n {
		for j, p := range rng.Perm(e)[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	run := func(c moeConfig, rows int, x []float32, id []int32, w []float32) []float32 {
		b.moe = c
		return expertsOnDevice(t, b, ex, rows, k, x, id, w)
	}
	same := func(name string, got, want []float32) {
		t.Helper()
		differ := 0
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(want[i]) {
				differ++
			}
		}
		if differ > 0 {
			t.Errorf("%s: %d of %d outputs differ", name, differ, len(got))
		}
	}
	for rows := 1; rows <= moeB1Tokens; rows++ {
		x, id, w := xv[:rows*hidden], ids[:rows*k], wv[:rows*k]
		want := run(moeConfig{}, rows, x, id, w)
		for _, mode := range []int{moeB1Fused, moeB1Two} {
			same(fmt.Sprintf("b1=%d, %d tokens, against the slot-a-pass kernels", mode, rows), run(moeConfig{b1: mode}, rows, x, id, w), want)
		}
	}
	alone := make([]float32, n*hidden)
	for i := range n {
		copy(alone[i*hidden:], run(moeConfig{b1: moeB1Fused}, 1, xv[i*hidden:(i+1)*hidden], ids[i*k:(i+1)*k], wv[i*k:(i+1)*k]))
	}
	for _, c := range []moeConfig{{}, {tiles: 1}, {tiles: 1, gt: 1}} {
		for _, rows := range []int{2, 3, 8, n} {
			same(fmt.Sprintf("%+v, %d tokens, against each token alone through b1", c, rows),
				run(c, rows, xv[:rows*hidden], ids[:rows*k], wv[:rows*k]), alone[:rows*hidden])
		}
	}
}

// BenchmarkMoEB1 times Experts at 1 to 3 tokens on Qwen3-30B-A3B's experts
// (128 of 768, top 8, hidden 2048) and GLM-4.7-Flash's (64 of 1,536, top 4
// and the folded shared expert, hidden 2048), 16 layers a step (each its
// own random bf16 experts and random routing; a step's chosen experts,
// 1.2 GB, far more than L2), the step a CUDA graph: "slot" the slot-a-pass
// kernels, "b1" ferrite_moe_b1 in one launch, "b1two" in two (the
// default). µs/layer is the step over the layers; GB/s counts the distinct
// chosen experts' weight bytes.
func BenchmarkMoEB1(b *testing.B) {
	for _, m := range []struct {
		name                        string
		e, k, shared, hidden, inter int
	}{{"qwen3-30b-a3b", 128, 8, 0, 2048, 768}, {"glm-4.7-flash", 64, 4, 1, 2048, 1536}} {
		b.Run(m.name, func(b *testing.B) { benchMoEB1(b, m.e, m.k, m.shared, m.hidden, m.inter, 16) })
	}
}

func benchMoEB1(b *testing.B, e, k, shared, hidden, inter, layers int) {
	be := openOps(b)
	mat := randomMats()
	exs := make([][]kernels.Expert, layers)
	for l := range exs {
		exs[l] = make([]kernels.Expert, e+shared)
		for i := range exs[l] {
			exs[l][i] = kernels.Expert{GateUp: mat(2*inter, hidden), Down: mat(hidden, inter)}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	kw := k + shared
	for n := 1; n <= moeB1Tokens; n++ {
		x := f32Tensor(b, be, n, hidden, randF32(rng, n*hidden))
		y := f32Tensor(b, be, n, hidden, make([]float32, n*hidden))
		ids := make([]kernels.Tensor, layers)
		ws := make([]kernels.Tensor, layers)
		distinct := 0
		for l := range layers {
			v := make([]int32, n*kw)
			used := map[int32]bool{}
			for i := range n {
				for j, p := range rng.Perm(e)[:k] {
					v[i*kw+j] = int32(p)
					used[int32(p)] = true
				}
				for q := range shared {
					v[i*kw+k+q] = int32(e + q)
					used[int32(e+q)] = true
				}
			}
			distinct += len(used)
			ids[l] = i32Tensor(b, be, n, kw, v)
			ws[l] = f32Tensor(b, be, n, kw, randF32(rng, n*kw))
		}
		step := func() {
			be.BeginStep()
			for l := range layers {
				be.Experts(y, x, ids[l], ws[l], exs[l])
			}
			be.EndStep()
		}
		for _, v := range []struct {
			name string
			c    moeConfig
		}{{"slot", moeConfig{}}, {"b1", moeConfig{b1: moeB1Fused}}, {"b1two", moeConfig{b1: moeB1Two}}} {
			be.moe = v.c
			b.Run(fmt.Sprint("n=", n, "/", v.name), func(b *testing.B) {
				sec := timeSteps(b, be, step)
				bytes := float64(distinct) * 3 * float64(hidden*inter) * 2
				b.ReportMetric(sec*1e6/float64(layers), "µs/layer")
				b.ReportMetric(bytes/sec/1e9, "GB/s")
			})
		}
		be.moe = moeConfig{}
	}
}

// TestMoEB1Config checks FERRITE_MOE_B1's reading: unset, ferrite_moe_b1
// in two launches for one token only; 0 off; 1 or 2 that form for 1 to 3
// tokens; anything else the default.
func TestMoEB1Config(t *testing.T) {
	for _, c := range []struct {
		env        string
		set        bool
		b1, b1Most int
	}{{"", false, moeB1Two, 1}, {"0", true, 0, 1}, {"1", true, moeB1Fused, moeB1Tokens},
		{"2", true, moeB1Two, moeB1Tokens}, {"4", true, moeB1Two, 1}, {"9", true, moeB1Two, 1}, {"x", true, moeB1Two, 1}} {
		if c.set {
			t.Setenv("FERRITE_MOE_B1", c.env)
		} else {
			t.Setenv("FERRITE_MOE_B1", "")
			os.Unsetenv("FERRITE_MOE_B1")
		}
		got := moeConfigFromEnv()
		if got.b1 != c.b1 || got.b1Most != c.b1Most {
			t.Errorf("FERRITE_MOE_B1=%q (set %v): b1 %d for up to %d tokens, want %d for up to %d", c.env, c.set, got.b1, got.b1Most, c.b1, c.b1Most)
		}
	}
}
