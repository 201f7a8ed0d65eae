package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func f32Mat(rows, cols int, v []float32) *kernels.Mat {
	m := &kernels.Mat{DType: kernels.F32, Rows: rows, Cols: cols, Data: make([]byte, 4*len(v))}
	for i, x := range v {
		b := math.Float32bits(x)
		m.Data[4*i], m.Data[4*i+1], m.Data[4*i+2], m.Data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	return m
}

func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

func TestRMSNorm(t *testing.T) {
	x := []float32{1, -2, 3, 4, 0, 0, 0, 1e-3}
	w := []float32{1, 2, 0.5, -1}
	y := make([]float32, 8)
	(&RMSNorm{W: w, Eps: 1e-6}).Forward(y, x, 2)
	r := float32(1 / math.Sqrt((1+4+9+16)/4.0+1e-6))
	near(t, "plain", y[:4], []float32{r, -4 * r, 1.5 * r, -4 * r}, 1e-6)
	r2 := float32(1 / math.Sqrt(1e-6/4+1e-6))
	near(t, "small row", y[4:], []float32{0, 0, 0, -1e-3 * r2}, 1e-6)
	(&RMSNorm{W: w, Eps: 1e-6, Offset: true}).Forward(y, x, 1)
	near(t, "zero-centred", y[:4], []float32{2 * r, -6 * r, 4.5 * r, 0}, 1e-6)
}

// TestRopeNeoXPartial checks the half-split rotation inside a partial slice
// against the textbook formula in float64.
func TestRopeNeoXPartial(t *testing.T) {
	r, err := NewRoPE(RopeConfig{HeadDim: 8, PartialRotaryFactor: 0.5, Theta: 100})
	if err != nil {
		t.Fatal(err)
	}
	if r.Dim != 4 {
		t.Fatalf("Dim %d", r.Dim)
	}
	r.Ensure(8)
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8}
	orig := slices.Clone(x)
	const pos = 5
	r.Apply(x, 2, 8, pos)
	for h := range 2 {
		v := orig[h*8:]
		for i := range 2 {
			f := 1 / math.Pow(100, float64(2*i)/4)
			c, s := math.Cos(pos*f), math.Sin(pos*f)
			a, b := float64(v[i]), float64(v[i+2])
			near(t, "rotated", x[h*8+i:h*8+i+1], []float32{float32(a*c - b*s)}, 1e-6)
			near(t, "rotated", x[h*8+i+2:h*8+i+3], []float32{float32(b*c + a*s)}, 1e-6)
		}
		near(t, "pass-through", x[h*8+4:h*8+8], v[4:8], 0)
	}
}

func TestRopeInterleaved(t *testing.T) {
	r, _ := NewRoPE(RopeConfig{HeadDim: 4, Theta: 10000, Interleaved: true})
	r.Ensure(1)
	x := []float32{1, 2, 3, 4}
	r.Apply(x, 1, 4, 0)
	near(t, "position 0 is identity", x, []float32{1, 2, 3, 4}, 0)
	r.Ensure(300) // growth keeps earlier rows
	x = []float32{1, 0, 1, 0}
	r.Apply(x, 1, 4, 3)
	f1 := 1 / math.Pow(10000, 0.5)
	near(t, "pairs", x, []float32{float32(math.Cos(3)), float32(math.Sin(3)), float32(math.Cos(3 * f1)), float32(math.Sin(3 * f1))}, 1e-6)
}

func TestRopeScaling(t *testing.T) {
	base, _ := NewRoPE(RopeConfig{HeadDim: 64, Theta: 500000})
	l3, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192})
	if err != nil {
		t.Fatal(err)
	}
	// Wavelengths under 8192/4 keep their frequency, over 8192 are divided by 8.
	for i, f := range base.invFreq {
		wave := 2 * math.Pi / float64(f)
		switch {
		case wave < 2048 && l3.invFreq[i] != f:
			t.Fatalf("llama3 high frequency %d changed", i)
		case wave > 8192 && math.Abs(float64(l3.invFreq[i]-f/8)) > 1e-6*float64(f):
			t.Fatalf("llama3 low frequency %d: %g, want %g", i, l3.invFreq[i], f/8)
		case wave >= 2048 && wave <= 8192 && !(l3.invFreq[i] <= f && l3.invFreq[i] >= f/8):
			t.Fatalf("llama3 medium frequency %d outside the blend", i)
		}
	}
	y, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000, Type: "yarn", Factor: 4, OriginalMaxPositions: 4096, MaxPositions: 16384})
	if err != nil {
		t.Fatal(err)
	}
	if want := float32(0.1*math.Log(4) + 1); math.Abs(float64(y.Scale-want)) > 1e-6 {
		t.Fatalf("yarn scale %g, want %g", y.Scale, want)
	}
	b2, _ := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000})
	if y.invFreq[0] != b2.invFreq[0] || math.Abs(float64(y.invFreq[31]-b2.invFreq[31]/4)) > 1e-6*float64(b2.invFreq[31]) {
		t.Fatalf("yarn: first %g (want %g), last %g (want %g)", y.invFreq[0], b2.invFreq[0], y.invFreq[31], b2.invFreq[31]/4)
	}
	if _, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000, Type: "dynamic", Factor: 2}); err == nil {
		t.Fatal("dynamic rope: want an unsupported error")
	}
	if _, err := NewRoPE(RopeConfig{HeadDim: 6, PartialRotaryFactor: 0.5, Theta: 10000}); err == nil {
		t.Fatal("odd rotary dim: want error")
	}
}

// TestAttentionPaged compares paged attention over fragmented block tables
// (including a forked prefix) with dense causal attention.
func TestAttentionPaged(t *testing.T) {
	const heads, kvHeads, hd = 4, 2, 8
	rng := rand.New(rand.NewPCG(1, 1))
	layout := kvcache.Layout{{K: kvHeads * hd, V: kvHeads * hd}}
	c, err := kvcache.New(layout, kvcache.Options{BlockSize: 3, Budget: 64 * 3 * layout.BytesPerToken()})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAttention(0, heads, kvHeads, hd)
	be := cpu.New(3)

	// Sequence A: 40 tokens; B forks A's first 7 and adds 4 of its own.
	lenA, forkAt, lenB := 40, 7, 11
	kA, vA := randVec(rng, lenA*kvHeads*hd), randVec(rng, lenA*kvHeads*hd)
	sa := c.NewSeq()
	c.Reserve(sa, lenA)
	tokA := &Tokens{KV: []*kvcache.Seq{sa}}
	for p := range lenA {
		tokA.Pos, tokA.Seq = append(tokA.Pos, int32(p)), append(tokA.Seq, 0)
	}
	a.Store(c, tokA, kA, vA)
	sb, _ := c.Fork(sa, forkAt)
	c.Reserve(sb, lenB)
	kB := append(slices.Clone(kA[:forkAt*kvHeads*hd]), randVec(rng, (lenB-forkAt)*kvHeads*hd)...)
	vB := append(slices.Clone(vA[:forkAt*kvHeads*hd]), randVec(rng, (lenB-forkAt)*kvHeads*hd)...)
	tokB := &Tokens{KV: []*kvcache.Seq{sb}}
	for p := forkAt; p < lenB; p++ {
		tokB.Pos, tokB.Seq = append(tokB.Pos, int32(p)), append(tokB.Seq, 0)
	}
	a.Store(c, tokB, kB[forkAt*kvHeads*hd:], vB[forkAt*kvHeads*hd:])

	// One batch: positions 8..10 of B (row by row) and the last 20
	// positions of A (a prefill chunk: matrix products).
	tok := &Tokens{Pos: []int32{8, 9, 10}, Seq: []int32{0, 0, 0}, KV: []*kvcache.Seq{sb, sa}}
	for p := 20; p < lenA; p++ {
		tok.Pos, tok.Seq = append(tok.Pos, int32(p)), append(tok.Seq, 1)
	}
	q := randVec(rng, tok.N()*heads*hd)
	out := make([]float32, len(q))
	a.Forward(be, c, tok, out, q)

	dense := func(k, v []float32, pos int, qv []float32, kvh int) []float32 {
		sc := make([]float64, pos+1)
		mx := math.Inf(-1)
		for p := range sc {
			var s float64
			for d := range hd {
				s += float64(qv[d]) * float64(k[p*kvHeads*hd+kvh*hd+d])
			}
			sc[p] = s / math.Sqrt(hd)
			mx = max(mx, sc[p])
		}
		var sum float64
		for p := range sc {
			sc[p] = math.Exp(sc[p] - mx)
			sum += sc[p]
		}
		o := make([]float32, hd)
		for d := range hd {
			var acc float64
			for p := range sc {
				acc += sc[p] / sum * float64(v[p*kvHeads*hd+kvh*hd+d])
			}
			o[d] = float32(acc)
		}
		return o
	}
	for i, p := range tok.Pos {
		k, v := kB, vB
		if tok.Seq[i] == 1 {
			k, v = kA, vA
		}
		for h := range heads {
			want := dense(k, v, int(p), q[(i*heads+h)*hd:], h/(heads/kvHeads))
			near(t, "attention", out[(i*heads+h)*hd:(i*heads+h+1)*hd], want, 1e-5)
		}
	}
}

func TestRouterSoftmax(t *testing.T) {
	// One token, logits = x·Wᵀ = W's first column when x = e0.
	logits := []float32{1, 3, 2, 0.5}
	w := make([]float32, 4*2)
	for e, l := range logits {
		w[e*2] = l
	}
	r := &Router{W: f32Mat(4, 2, w), Scoring: SoftmaxScoring, TopK: 2, Scale: 1}
	idx, wt := make([]int32, 2), make([]float32, 2)
	var a Arena
	r.Route(cpu.New(1), &a, []float32{1, 0}, 1, idx, wt)
	p := slices.Clone(logits)
	Softmax(p)
	if !slices.Equal(idx, []int32{1, 2}) {
		t.Fatalf("experts %v, want [1 2]", idx)
	}
	near(t, "softmax weights", wt, []float32{p[1], p[2]}, 1e-6)
	r.NormTopK = true
	r.Route(cpu.New(1), &a, []float32{1, 0}, 1, idx, wt)
	near(t, "renormalised", wt, []float32{p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])}, 1e-6)
}

func TestRouterSigmoidGrouped(t *testing.T) {
	// 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
	logits := []float32{2.0, -1, 0.5, 0.4, 1.9, -3, 0.0, 0.0}
	bias := []float32{0, 0, 0, 0, 0, 0, 0.8, 0.8}
	w := make([]float32, 8)
	copy(w, logits)
	r := &Router{W: f32Mat(8, 1, w), Bias: bias, Scoring: SigmoidScoring, TopK: 2, NormTopK: true, Scale: 2.5, Groups: 4, TopKGroups: 2}
	idx, wt := make([]int32, 2), make([]float32, 2)
	var a Arena
	r.Route(cpu.New(1), &a, []float32{1}, 1, idx, wt)
	// Biased scores: s = sigmoid(l) + b. Group sums of top-2:
	// g0 = s(2)+s(-1), g1 = s(.5)+s(.4), g2 = s(1.9)+s(-3), g3 = 2(s(0)+.8) = 2.6.
	// g3 and g1 (≈1.22) win over g0 (≈1.15) and g2 (≈0.92), so expert 0
	// (the best unbiased score) and expert 4 are masked out.
	s := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	slices.Sort(idx)
	if !slices.Equal(idx, []int32{6, 7}) {
		t.Fatalf("experts %v, want [6 7]", idx)
	}
	want := float32(s(0) / (2*s(0) + 1e-20) * 2.5)
	near(t, "weights use unbiased scores", wt, []float32{want, want}, 1e-6)

	r.Groups, r.Bias = 1, nil
	r.Route(cpu.New(1), &a, []float32{1}, 1, idx, wt)
	if !slices.Equal(idx, []int32{0, 4}) {
		t.Fatalf("ungrouped experts %v, want [0 4]", idx)
	}
	sum := s(2) + s(1.9)
	near(t, "ungrouped weights", wt, []float32{float32(s(2) / sum * 2.5), float32(s(1.9) / sum * 2.5)}, 1e-6)
}

// TestMoE checks the grouped-by-expert MoE against a per-token loop, with
// fused and separate expert storage and a gated shared expert.
func TestMoE(t *testing.T) {
	const hidden, inter, experts, n = 6, 5, 4, 7
	rng := rand.New(rand.NewPCG(5, 5))
	be := cpu.New(2)
	mk := func(r, c int) *kernels.Mat { return f32Mat(r, c, randVec(rng, r*c)) }
	fused := make([]Expert, experts)
	split := make([]Expert, experts)
	for e := range experts {
		g, u, d := mk(inter, hidden), mk(inter, hidden), mk(hidden, inter)
		split[e] = Expert{Gate: g, Up: u, Down: d}
		fused[e] = Expert{GateUp: &kernels.Mat{DType: kernels.F32, Rows: 2 * inter, Cols: hidden, Data: append(slices.Clone(g.Data), u.Data...)}, Down: d}
	}
	shared := &MLP{Gate: &Linear{W: mk(3, hidden)}, Up: &Linear{W: mk(3, hidden)}, Down: &Linear{W: mk(hidden, 3)}}
	router := Router{W: mk(experts, hidden), Scoring: SoftmaxScoring, TopK: 2, NormTopK: true, Scale: 1}
	x := randVec(rng, n*hidden)

	var a Arena
	want := make([]float32, n*hidden)
	idx, wt := make([]int32, n*2), make([]float32, n*2)
	router.Route(be, &a, x, n, idx, wt)
	for i := range n {
		xi := x[i*hidden : (i+1)*hidden]
		for k := range 2 {
			ex := split[idx[i*2+k]]
			m := &MLP{Gate: &Linear{W: ex.Gate}, Up: &Linear{W: ex.Up}, Down: &Linear{W: ex.Down}}
			y := make([]float32, hidden)
			m.Forward(be, &a, y, xi, 1)
			Axpy(want[i*hidden:(i+1)*hidden], wt[i*2+k], y)
		}
		ys := make([]float32, hidden)
		shared.Forward(be, &a, ys, xi, 1)
		Axpy(want[i*hidden:(i+1)*hidden], 1, ys)
	}
	for name, ex := range map[string][]Expert{"fused": fused, "split": split} {
		m := &MoE{Router: router, Experts: ex, Shared: shared}
		got := make([]float32, n*hidden)
		a.Reset()
		m.Forward(be, &a, got, x, n)
		near(t, name, got, want, 1e-5)
	}
	// A gated shared expert is the op set's (gqa.MoE): here a panic.
	defer func() {
		if recover() == nil {
			t.Error("host Forward ran a gated shared expert")
		}
	}()
	(&MoE{Router: router, Experts: split, Shared: shared, SharedGate: &Linear{W: mk(1, hidden)}}).Forward(be, &a, make([]float32, n*hidden), x, n)
}

func TestArena(t *testing.T) {
	var a Arena
	x := a.Get(10)
	m := a.Mark()
	y := a.Get(5)
	a.Release(m)
	z := a.Get(5)
	if len(x) != 10 || len(y) != 5 || len(z) != 5 {
		t.Fatal("lengths")
	}
	a.Reset()
	p := a.Get(15)
	q := a.Get(1)
	if cap(p) != 15 || len(a.buf) < 15 {
		t.Fatalf("after Reset the buffer should hold the previous peak: %d", len(a.buf))
	}
	p[14] = 1
	q[0] = 2
	if p[14] != 1 {
		t.Fatal("slices overlap")
	}
}
