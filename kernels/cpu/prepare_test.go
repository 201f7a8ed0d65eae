package cpu

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// prepWeights returns a BF16 weight above the resident copy's floor, a
// Q8_0 and a Q4_0 one, and an x of 3 rows for them (all 1024 wide), with
// the bytes of the forms MatMul keeps of each on this CPU: the resident
// copy where BF16 takes the VDPBF16PS path, the x8 packing where there are
// x8 kernels (the Go twins of both, until the test ends, on a CPU without
// either, or under noasm).
func prepWeights(t *testing.T) (ws []*kernels.Mat, x []float32, res, x8 int64) {
	t.Helper()
	if bf16TilesFor() == nil && x8For(kernels.Q8_0) == nil {
		t.Cleanup(ForceGenericBF16())
		t.Cleanup(ForceGenericX8())
	}
	const cols = 1024
	rng := rand.New(rand.NewPCG(16, 16))
	ws = []*kernels.Mat{
		kerneltest.NewMat(rng, kernels.BF16, 520, cols, 0, 0), // 1.02 MiB
		kerneltest.NewMat(rng, kernels.Q8_0, 72, cols, 0, 0),
		kerneltest.NewMat(rng, kernels.Q4_0, 40, cols, 0, 0),
	}
	x = kerneltest.RandN(rng, 3*cols)
	if residentOK(ws[0], bf16Path(ws[0], 1, true), false) {
		res = int64(len(ws[0].Data))
	}
	for _, w := range ws[1:] {
		if x8Persistent(w, false) {
			G := x8For(w.DType).rows
			x8 += int64(w.Rows / G * x8RowBytes(w.DType, cols, G))
		}
	}
	return ws, x, res, x8
}

// matMulAll returns y of every w for x's 3 rows and for its first row.
func matMulAll(b *Backend, ws []*kernels.Mat, x []float32) [][]float32 {
	var ys [][]float32
	for _, w := range ws {
		for _, n := range []int{1, 3} {
			y := make([]float32, n*w.Rows)
			b.MatMul(y, x[:n*w.Cols], w, n)
			ys = append(ys, y)
		}
	}
	return ys
}

// newBF16x returns a backend of threads workers that rounds x to bfloat16
// (as the engine sets it for a model with a bfloat16 cache).
func newBF16x(threads int) *Backend {
	b := New(threads)
	b.SetBF16Activations(true)
	return b
}

// unprepared returns matMulAll of a backend that makes the forms on first
// use.
func unprepared(ws []*kernels.Mat, x []float32) [][]float32 {
	b := newBF16x(2)
	defer b.Close()
	return matMulAll(b, ws, x)
}

// sameBits fails t where got and want differ in a bit.
func sameBits(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	for i := range want {
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("%s: product %d, y[%d] = %g, want %g as without preparation", what, i, j, got[i][j], want[i][j])
			}
		}
	}
}

// TestPrepareWeights checks that PrepareWeights makes the forms the first
// MatMuls would make, and only those (no resident copy with the copies
// off or bf16 activations off), so that MatMul then makes none, with the
// bits of a backend that made them itself.
func TestPrepareWeights(t *testing.T) {
	ws, x, res, x8 := prepWeights(t)
	t.Logf("forms: %d resident bytes, %d packed", res, x8)
	lazy := newBF16x(2)
	defer lazy.Close()
	want := matMulAll(lazy, ws, x)
	if r, p := lazy.res.bytes.Load(), lazy.x8.bytes.Load(); r != res || p != x8 {
		t.Fatalf("MatMul made %d resident and %d packed bytes, want %d and %d", r, p, res, x8)
	}

	b := newBF16x(2)
	defer b.Close()
	if err := b.PrepareWeights(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	if r, p := b.res.bytes.Load(), b.x8.bytes.Load(); r != res || p != x8 {
		t.Fatalf("PrepareWeights made %d resident and %d packed bytes, want %d and %d", r, p, res, x8)
	}
	if n := len(b.res.m) + len(b.x8.m); res > 0 && n != 3 || res == 0 && n != 2 {
		t.Errorf("%d cache entries after PrepareWeights", n)
	}
	got := matMulAll(b, ws, x)
	if r, p := b.res.bytes.Load(), b.x8.bytes.Load(); r != res || p != x8 {
		t.Errorf("after MatMuls on prepared weights: %d resident and %d packed bytes, want %d and %d", r, p, res, x8)
	}
	sameBits(t, "prepared", got, want)

	// The rules MatMul keeps: no copies with FERRITE_CPU_RESIDENT=0, nor
	// with x left in float32 (the float tiles read the weight in place).
	for name, set := range map[string]func(*Backend) func(){
		"resident off": func(*Backend) func() { residentOff.Store(true); return func() { residentOff.Store(false) } },
		"f32 x":        func(b *Backend) func() { b.SetBF16Activations(false); return func() {} },
	} {
		b := newBF16x(1)
		restore := set(b)
		if err := b.PrepareWeights(context.Background(), ws[:1]); err != nil {
			t.Fatal(err)
		}
		if r := b.res.bytes.Load(); r != 0 {
			t.Errorf("%s: %d resident bytes prepared", name, r)
		}
		restore()
		b.Close()
	}
}

// TestPrepareWeightsBesideMatMul runs PrepareWeights on one goroutine while
// another multiplies the same weights (run it with -race), switching bf16x
// off for a while as an op may: every product must have the bits of an
// unprepared backend's, and each weight's form be made once.
func TestPrepareWeightsBesideMatMul(t *testing.T) {
	ws, x, res, x8 := prepWeights(t)
	want := unprepared(ws, x)
	for round := range 4 {
		b := newBF16x(2)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := ws
			if round%2 == 1 { // the other order: MatMul first on some
				order = []*kernels.Mat{ws[2], ws[1], ws[0]}
			}
			if err := b.PrepareWeights(context.Background(), order); err != nil {
				t.Error(err)
			}
		}()
		// An op that switches bf16x off for a product of its own (mHC's
		// mix), as the preparation starts: it must not read bf16x.
		b.bf16x = false
		b.MatMul(make([]float32, ws[2].Rows), x[:ws[2].Cols], ws[2], 1)
		b.bf16x = true
		got := matMulAll(b, ws, x)
		wg.Wait()
		sameBits(t, "beside PrepareWeights", got, want)
		if r, p := b.res.bytes.Load(), b.x8.bytes.Load(); r != res || p != x8 {
			t.Errorf("round %d: %d resident and %d packed bytes, want one form each: %d and %d", round, r, p, res, x8)
		}
		b.Close()
	}
}

// TestPrepareWeightsStops checks that PrepareWeights stops before the next
// weight once its context is done or the backend closed, and that a
// weight it never reached is made by MatMul as before.
func TestPrepareWeightsStops(t *testing.T) {
	ws, x, _, x8 := prepWeights(t)
	b := newBF16x(2)
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.PrepareWeights(ctx, ws); !errors.Is(err, context.Canceled) {
		t.Errorf("PrepareWeights after cancel: %v, want context.Canceled", err)
	}
	if r, p := b.res.bytes.Load(), b.x8.bytes.Load(); r+p != 0 {
		t.Errorf("cancelled: %d resident and %d packed bytes made", r, p)
	}
	// Cancelled while at work: the weight begun is finished, no other.
	ctx, cancel = context.WithCancel(context.Background())
	many := make([]*kernels.Mat, 64)
	for i := range many {
		w := *ws[1+i%2]
		many[i] = &w
	}
	prepHook = func(i int) {
		if i == 2 {
			cancel()
		}
	}
	defer func() { prepHook = nil }()
	if err := b.PrepareWeights(ctx, many); !errors.Is(err, context.Canceled) {
		t.Errorf("PrepareWeights cancelled at work: %v, want context.Canceled", err)
	}
	if n := len(b.x8.m); x8 > 0 && n != 3 {
		t.Errorf("cancelled after the third weight: %d of %d weights packed", n, len(many))
	}
	prepHook = nil
	b.Close()
	if err := b.PrepareWeights(context.Background(), ws); !errors.Is(err, errClosed) {
		t.Errorf("PrepareWeights after Close: %v, want errClosed", err)
	}
	got := matMulAll(b, ws, x) // single-threaded now, on forms MatMul makes
	sameBits(t, "after Close", got, unprepared(ws, x))
}

// TestCloseDropsWeightForms: Close lets go of the forms MatMul keeps per
// weight (a model switched away from would otherwise keep as much memory
// again as its weights for as long as the backend is held), and the
// backend, single-threaded after Close, still gives the same bits.
func TestCloseDropsWeightForms(t *testing.T) {
	ws, x, res, x8 := prepWeights(t)
	b := newBF16x(2)
	want := matMulAll(b, ws, x)
	if r, p := b.res.bytes.Load(), b.x8.bytes.Load(); r != res || p != x8 {
		t.Fatalf("MatMul made %d resident and %d packed bytes, want %d and %d", r, p, res, x8)
	}
	if res+x8 == 0 {
		t.Skip("no per-weight forms on this CPU")
	}
	b.Close()
	if r, p, n := b.res.bytes.Load(), b.x8.bytes.Load(), len(b.res.m)+len(b.x8.m); r != 0 || p != 0 || n != 0 {
		t.Errorf("after Close: %d resident and %d packed bytes in %d entries, want none", r, p, n)
	}
	sameBits(t, "after Close", matMulAll(b, ws, x), want)
}

// TestHasCopy: HasCopy reports a BF16 weight's resident copy once made, and
// no copy for a weight that has none (a packed Q8_0 one reads its packing,
// which is not a copy of its bytes).
func TestHasCopy(t *testing.T) {
	ws, x, res, _ := prepWeights(t)
	b := newBF16x(1)
	defer b.Close()
	if b.HasCopy(ws[0]) {
		t.Fatal("HasCopy before any MatMul")
	}
	matMulAll(b, ws, x)
	if got := b.HasCopy(ws[0]); got != (res > 0) {
		t.Errorf("HasCopy of the BF16 weight = %v with %d resident bytes", got, res)
	}
	if b.HasCopy(ws[1]) || b.HasCopy(ws[2]) {
		t.Error("HasCopy of a quantized weight")
	}
}

// mlaDecode returns the output of one AttentionMLA decode row on b in the
// absorbed form (position 5 of one sequence over random F32 latents, no
// rotated dims), drawn from seed.
func mlaDecode(t *testing.T, b *Backend, kvB *kernels.Mat, s kernels.MLAShape, seed uint64) []float32 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 17))
	const bs, pos = 8, 5
	alloc := func(dt kernels.DType, rows, cols int) kernels.Tensor {
		x, err := b.Alloc(dt, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	i32 := func(v int32) kernels.Tensor {
		x := alloc(kernels.I32, 1, 1)
		b.WriteI32(x, []int32{v})
		return x
	}
	cache := alloc(kernels.F32, bs, s.KVLora)
	b.WriteF32(cache, kerneltest.RandN(rng, bs*s.KVLora))
	q := alloc(kernels.F32, 1, s.Heads*(s.Nope+s.Rope))
	b.WriteF32(q, kerneltest.RandN(rng, s.Heads*(s.Nope+s.Rope)))
	out := alloc(kernels.F32, 1, s.Heads*s.V)
	p := &kernels.Paged{Pos: i32(pos), Seq: i32(0), Slot: i32(pos), Blocks: i32(0), BlockSize: bs}
	s.Form = kernels.MLAAbsorbed
	b.BeginStep()
	b.AttentionMLA(out, q, cache, kvB, nil, p, s, kernels.Tensor{})
	b.EndStep()
	y := make([]float32, s.Heads*s.V)
	b.ReadF32(y, out)
	return y
}

// TestPrepareMLASplits checks that PrepareWeights makes the per-head split
// of a kv_b_proj declared with its shape (DeclareKVB), so that the first
// absorbed AttentionMLA makes none and gets the bits of a backend that
// made it itself; and that it makes none for a weight not declared, one
// declared for the naive form or with a shape it does not match, or one
// declared but not among the weights it is given; and that beside
// AttentionMLA each split is made once.
func TestPrepareMLASplits(t *testing.T) {
	s := kernels.MLAShape{Heads: 3, Nope: 8, V: 6, KVLora: 32, Scale: 0.3}
	rng := rand.New(rand.NewPCG(17, 17))
	for _, dt := range []kernels.DType{kernels.BF16, kernels.Q8_0, kernels.F32} {
		t.Run(dt.String(), func(t *testing.T) {
			kvB := kerneltest.NewMat(rng, dt, s.Heads*(s.Nope+s.V), s.KVLora, 0, 0)
			lazy := New(2)
			defer lazy.Close()
			want := mlaDecode(t, lazy, kvB, s, 1)
			if _, ok := lazy.mla.peek(kvB); !ok || len(lazy.mla.m) != 1 {
				t.Fatalf("the first AttentionMLA made %d splits, want 1", len(lazy.mla.m))
			}

			b := New(2)
			defer b.Close()
			b.DeclareKVB(kvB, s)
			if err := b.PrepareWeights(context.Background(), []*kernels.Mat{kvB}); err != nil {
				t.Fatal(err)
			}
			sp, ok := b.mla.peek(kvB)
			if !ok || sp == nil {
				t.Fatal("PrepareWeights made no split of the declared kv_b_proj")
			}
			made := b.mla.bytes.Load()
			got := mlaDecode(t, b, kvB, s, 1)
			if sp2, _ := b.mla.peek(kvB); len(b.mla.m) != 1 || sp2 != sp || b.mla.bytes.Load() != made {
				t.Errorf("AttentionMLA after PrepareWeights made a split of its own")
			}
			sameBits(t, "prepared split", [][]float32{got}, [][]float32{want})
		})
	}

	// Beside AttentionMLA on the same weights (run it with -race): one
	// split each, the same bits.
	kvBs := []*kernels.Mat{
		kerneltest.NewMat(rng, kernels.BF16, s.Heads*(s.Nope+s.V), s.KVLora, 0, 0),
		kerneltest.NewMat(rng, kernels.Q8_0, s.Heads*(s.Nope+s.V), s.KVLora, 0, 0),
	}
	lazy := New(2)
	var want [][]float32
	for _, w := range kvBs {
		want = append(want, mlaDecode(t, lazy, w, s, 2))
	}
	one := lazy.mla.bytes.Load()
	lazy.Close()
	for round := range 4 {
		b := New(2)
		for _, w := range kvBs {
			b.DeclareKVB(w, s)
		}
		order := kvBs
		if round%2 == 1 {
			order = []*kernels.Mat{kvBs[1], kvBs[0]}
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.PrepareWeights(context.Background(), order); err != nil {
				t.Error(err)
			}
		}()
		var got [][]float32
		for _, w := range kvBs {
			got = append(got, mlaDecode(t, b, w, s, 2))
		}
		wg.Wait()
		sameBits(t, "beside PrepareWeights", got, want)
		if n := b.mla.bytes.Load(); n != one {
			t.Errorf("round %d: %d bytes of splits, want one split each: %d", round, n, one)
		}
		b.Close()
	}

	kvB := kerneltest.NewMat(rng, kernels.BF16, s.Heads*(s.Nope+s.V), s.KVLora, 0, 0)
	other := kerneltest.NewMat(rng, kernels.BF16, 16, s.KVLora, 0, 0)
	naive := s
	naive.Form = kernels.MLANaive
	wide := s
	wide.KVLora *= 2
	for name, c := range map[string]struct {
		decl bool
		s    kernels.MLAShape
		ws   []*kernels.Mat
	}{
		"not declared":   {false, s, []*kernels.Mat{kvB}},
		"naive":          {true, naive, []*kernels.Mat{kvB}},
		"shape mismatch": {true, wide, []*kernels.Mat{kvB}},
		"not in ws":      {true, s, []*kernels.Mat{other}},
	} {
		b := New(1)
		if c.decl {
			b.DeclareKVB(kvB, c.s)
		}
		if err := b.PrepareWeights(context.Background(), c.ws); err != nil {
			t.Fatal(err)
		}
		if n := len(b.mla.m); n != 0 {
			t.Errorf("%s: PrepareWeights made %d splits", name, n)
		}
		b.Close()
	}
}
