package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// SampleShapes are TopKRows's cases (rows, vocabulary, k): k = 1 (the
// argmax), k = V, k around a warp and a block, and vocabularies from one
// column to a real one (Qwen3's 151,936; skipped in -short runs).
var SampleShapes = []struct{ R, V, K int }{
	{1, 1, 1}, {3, 7, 1}, {3, 7, 7}, {8, 33, 5}, {8, 300, 1}, {8, 300, 40}, {5, 1000, 256},
	{16, 4099, 1}, {16, 4099, 33}, {4, 70000, 256}, {33, 151936, 1}, {33, 151936, 256},
}

// sampleRow fills row with the kind of values kind selects: normals,
// normals rounded to bfloat16 (many ties), small integers (ties
// everywhere), and rows seasoned with NaN, ±Inf and ±0.
func sampleRow(rng *rand.Rand, row []float32, kind int) {
	for j := range row {
		switch kind % 6 {
		case 0:
			row[j] = float32(rng.NormFloat64() * 4)
		case 1:
			row[j] = kernels.BF16ToF32(kernels.F32ToBF16(float32(rng.NormFloat64())))
		case 2:
			row[j] = float32(rng.IntN(5) - 2)
		case 3: // only a few values above −∞, NaN among them
			row[j] = float32(math.Inf(-1))
			if rng.IntN(50) == 0 {
				row[j] = float32(math.NaN())
			} else if rng.IntN(50) == 0 {
				row[j] = float32(rng.NormFloat64())
			}
		case 4: // zeros of both signs at the top, a few +Inf
			row[j] = -float32(rng.IntN(3))
			if rng.IntN(2) == 0 && row[j] == 0 {
				row[j] = float32(math.Copysign(0, -1))
			}
			if rng.IntN(997) == 0 {
				row[j] = float32(math.Inf(1))
			}
		case 5: // all NaN or −∞ but for the last column
			row[j] = float32(math.NaN())
			if rng.IntN(2) == 0 {
				row[j] = float32(math.Inf(-1))
			}
			if j == len(row)-1 {
				row[j] = -1e30
			}
		}
	}
}

// sampleTest checks TopKRows bit for bit against ref.TopKRow: the
// selection and its order are exact, so are the values it copies.
func sampleTest(t *testing.T, d kernels.Device, so kernels.SampleOps) {
	rng := rand.New(rand.NewPCG(61, 62))
	for _, c := range SampleShapes {
		if testing.Short() && c.R*c.V > 1<<20 {
			continue
		}
		t.Run(fmt.Sprintf("R%d_V%d_k%d", c.R, c.V, c.K), func(t *testing.T) {
			x := make([]float32, c.R*c.V)
			for i := range c.R {
				sampleRow(rng, x[i*c.V:(i+1)*c.V], i)
			}
			lg := newBuf(t, d, c.R, c.V, x)
			out := newBuf(t, d, c.R, 2*c.K, nil)
			step(d, func() { so.TopKRows(out.t, lg.t) })
			got := out.read(t, "TopKRows")
			vals, cols := make([]float32, c.K), make([]int32, c.K)
			bad := 0
			for i := range c.R {
				ref.TopKRow(vals, cols, x[i*c.V:(i+1)*c.V])
				g := got[i*2*c.K : (i+1)*2*c.K]
				for j := range c.K {
					gv, gc := g[j], g[c.K+j]
					if math.Float32bits(gv) == math.Float32bits(vals[j]) && gc == float32(cols[j]) {
						continue
					}
					if bad++; bad <= 5 {
						t.Errorf("row %d (kind %d) rank %d: got column %g value %g, want column %d value %g",
							i, i%6, j, gc, gv, cols[j], vals[j])
					}
				}
			}
			if bad > 5 {
				t.Errorf("TopKRows R=%d V=%d k=%d: %d of %d candidates wrong", c.R, c.V, c.K, bad, c.R*c.K)
			}
		})
	}
}

// feedTest checks FeedIDs against a plain loop: the columns of a TopKRows
// output fed into a strided I32 destination, entries with a negative or
// out-of-range index left alone.
func feedTest(t *testing.T, d kernels.Device, do kernels.DraftOps) {
	rd, ok := d.(i32Reader)
	if !ok {
		t.Skip("the backend cannot read I32 tensors back")
	}
	rng := rand.New(rand.NewPCG(63, 64))
	for _, c := range []struct{ R, K, M int }{{1, 1, 1}, {3, 1, 5}, {4, 256, 7}, {2, 1, 300}} {
		t.Run(fmt.Sprintf("R%d_k%d_M%d", c.R, c.K, c.M), func(t *testing.T) {
			src := make([]float32, c.R*2*c.K)
			for i := range src {
				src[i] = float32(rng.IntN(1 << 24)) // exact integers up to 2^24, as TopKRows's columns
			}
			idx, before := make([]int32, c.M), make([]int32, 2*c.M)
			for i := range idx {
				idx[i] = int32(rng.IntN(len(src)+2) - 1) // −1 and len(src): left alone
			}
			for i := range before {
				before[i] = int32(rng.Uint32())
			}
			s := newBuf(t, d, c.R, 2*c.K, src)
			all := ints(t, d, c.M, 2, before) // dst is column 1: a stride of 2
			buf, off := all.Buffer()
			view := kernels.NewTensor(buf, kernels.I32, c.M, 1, 2, off+1) // (M, 1) column 1 of all
			ix := ints(t, d, c.M, 1, idx)
			step(d, func() { do.FeedIDs(view, s.t, ix) })
			got := make([]int32, 2*c.M)
			rd.ReadI32(got, all)
			for i := range c.M {
				want := [2]int32{before[2*i], before[2*i+1]}
				if j := idx[i]; j >= 0 && int(j) < len(src) {
					want[1] = int32(src[j])
				}
				if got[2*i] != want[0] || got[2*i+1] != want[1] {
					t.Errorf("row %d (index %d): got %d %d, want %d %d", i, idx[i], got[2*i], got[2*i+1], want[0], want[1])
				}
			}
		})
	}
}
