//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestLazyWrites checks the queued uploads (write, uploadAsyncL) and the
// batched read (ReadF32s): writes and a copy between them keep their
// order; writes queued before a step are what the step reads; writes that
// overflow the pinned staging buffer (which then waits for the stream and
// starts over) all land; and ReadF32s reads several tensors, contiguous or
// not, as ReadF32 does.
func TestLazyWrites(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(21, 22))
	equal := func(what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: [%d] = %g, want %g", what, i, got[i], want[i])
			}
		}
	}
	// Order: write x, copy x to y, write x again.
	x, y := f32Tensor(t, b, 4, 64, make([]float32, 256)), f32Tensor(t, b, 4, 64, make([]float32, 256))
	v1, v2 := randF32(rng, 256), randF32(rng, 256)
	b.WriteF32(x, v1)
	b.Copy(y, x)
	b.WriteF32(x, v2)
	gx, gy := make([]float32, 256), make([]float32, 256)
	b.ReadF32s([][]float32{gx, gy}, []kernels.Tensor{x, y})
	equal("x after the second write", gx, v2)
	equal("y, copied between the writes", gy, v1)

	// A step reads what was written before it began (twice each shape, so
	// the second runs from a captured graph).
	for step := range 4 {
		v := randF32(rng, 256)
		b.WriteF32(x, v)
		b.BeginStep()
		h := b.Scratch(kernels.F32, 4, 64)
		b.Copy(h, x)
		b.Copy(y, h)
		b.EndStep()
		b.ReadF32(gy, y)
		equal(fmt.Sprintf("step %d's copy of its lazily written input", step), gy, v)
	}

	// More than the staging buffer holds, in writes of lazyWriteMax.
	const per = lazyWriteMax / 4
	n := stagingBytes/lazyWriteMax + 3
	big := f32Tensor(t, b, n, per, make([]float32, n*per))
	vals := make([][]float32, n)
	for i := range n {
		vals[i] = randF32(rng, per)
		b.WriteF32(big.Slice(i, i+1), vals[i])
	}
	got := make([][]float32, n)
	rows := make([]kernels.Tensor, n)
	for i := range n {
		got[i], rows[i] = make([]float32, per), big.Slice(i, i+1)
	}
	b.ReadF32s(got, rows) // larger than the download staging buffer: one by one
	for i := range n {
		equal("a write past the staging buffer's end", got[i], vals[i])
	}

	// A strided view reads as ReadF32 reads it.
	buf, off := x.Buffer()
	cols := kernels.NewTensor(buf, kernels.F32, 4, 32, 64, off) // (4, 32) of x's (4, 64)
	g1, g2 := make([]float32, 128), make([]float32, 128)
	b.ReadF32s([][]float32{g1}, []kernels.Tensor{cols})
	b.ReadF32(g2, cols)
	equal("a strided view", g1, g2)
}

// TestCopyShapes runs Copy's three piece sizes: one long row (a recurrent
// state: 16-byte pieces over the whole grid), a strided view of 12-byte
// rows (4-byte pieces) and bf16 views of 6-byte rows (single bytes), each
// against the bytes it must move and leave alone.
func TestCopyShapes(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(5, 6))
	check := func(what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: [%d] = %#x, want %#x", what, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
	// One row of 1 MiB.
	v := randF32(rng, 1<<18)
	x, y := f32Tensor(t, b, 1, 1<<18, v), f32Tensor(t, b, 1, 1<<18, make([]float32, 1<<18))
	b.Copy(y, x)
	got := make([]float32, 1<<18)
	b.ReadF32(got, y)
	check("one long row", got, v)

	// Three of every row's 64 floats, into a (8, 3) tensor.
	src := randF32(rng, 8*64)
	xs := f32Tensor(t, b, 8, 64, src)
	view := xs
	view.Cols = 3
	ys := f32Tensor(t, b, 8, 3, make([]float32, 24))
	b.Copy(ys, view)
	want := make([]float32, 24)
	for r := range 8 {
		copy(want[r*3:r*3+3], src[r*64:r*64+3])
	}
	got = make([]float32, 24)
	b.ReadF32(got, ys)
	check("a strided view", got, want)

	// bf16 views: three of every row's 16 bf16 values (6 of its 32 bytes).
	sv, dv := randF32(rng, 4*8), randF32(rng, 4*8)
	xb, yb := f32Tensor(t, b, 4, 8, sv), f32Tensor(t, b, 4, 8, dv)
	bv, dvw := xb, yb
	for _, p := range []*kernels.Tensor{&bv, &dvw} {
		p.DType, p.Cols, p.Stride = kernels.BF16, 3, 16
	}
	b.Copy(dvw, bv)
	want = slices.Clone(dv)
	for r := range 4 {
		// 6 bytes: the first float and the low half (bf16 element 2) of the second.
		want[r*8] = sv[r*8]
		lo := math.Float32bits(sv[r*8+1]) & 0xffff
		want[r*8+1] = math.Float32frombits(math.Float32bits(dv[r*8+1])&0xffff0000 | lo)
	}
	got = make([]float32, 32)
	b.ReadF32(got, yb)
	check("bf16 views", got, want)
}
