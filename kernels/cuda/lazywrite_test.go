//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
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
