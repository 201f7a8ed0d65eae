//go:build !noasm

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
)

// TestBF16TilesMatchGo checks each VDPBF16PS tile against its Go twin for
// every column count mod 32, with NaN right after each weight row's k
// columns (the masked tail must not read it) and x padded as the driver
// pads it. The products are exact, so only the float32 summation order
// differs: 2⁻¹⁸ of Σ|x·w| (a 16-element row of float32 adds at most).
func TestBF16TilesMatchGo(t *testing.T) {
	if asmBF16Tiles() == nil {
		t.Skip("no AVX-512 BF16")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := []struct {
		name string
		r, c int
		asm  bf16TileFunc
		gen  bf16TileFunc
	}{
		{"R1C1", 1, 1, vdpbf16Tiles.r1c1, genericBF16Tiles.r1c1},
		{"R1C4", 1, 4, vdpbf16Tiles.r1c4, genericBF16Tiles.r1c4},
		{"R4C4", 4, 4, vdpbf16Tiles.r4c4, genericBF16Tiles.r4c4},
	}
	for _, k := range []int{0, 1, 2, 7, 31, 32, 33, 63, 64, 100, 255, 256, 257, 1024, 1055} {
		for _, s := range shapes {
			t.Run(fmt.Sprintf("%s/k=%d", s.name, k), func(t *testing.T) {
				ld := (k + 31) &^ 31
				var xr bf16Rows
				xr.resize(s.r, k)
				x := make([]float32, s.r*k)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				xr.roundRows(x, k, 0, s.r)
				// Weight rows of k columns with NaN between them and after
				// the last: a stride of ldw = k+3 elements.
				ldw := k + 3
				w := make([]byte, 2*(s.c*ldw))
				for i := range s.c * ldw {
					v := uint16(0x7fc1) // NaN
					if i%ldw < k {
						v = kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
					}
					w[2*i], w[2*i+1] = byte(v), byte(v>>8)
				}
				got := make([]float32, s.r*s.c)
				want := make([]float32, s.r*s.c)
				s.asm(got, s.c, xr.x, ld, w, ldw, k)
				s.gen(want, s.c, xr.x, ld, w, ldw, k)
				for r := range s.r {
					for c := range s.c {
						var abs float64
						for i := range k {
							abs += math.Abs(float64(kernels.BF16ToF32(xr.x[r*ld+i]) * bf16At(w[2*c*ldw:], i)))
						}
						g, e := got[r*s.c+c], want[r*s.c+c]
						if d := math.Abs(float64(g - e)); !(d <= abs/(1<<18)) {
							t.Errorf("y[%d, %d] = %g, Go twin %g (|Σ| %g)", r, c, g, e, abs)
						}
					}
				}
			})
		}
	}
}

// TestRoundBF16 checks the assembly rounding against kernels.F32ToBF16 on
// random bit patterns and the edge cases: ties, NaNs, infinities,
// subnormals, the largest finite values (which round to infinity).
func TestRoundBF16(t *testing.T) {
	if !cpuinfo.BF16() {
		t.Skip("no AVX-512 BF16")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	bits := []uint32{0, 1 << 31, 0x7f800000, 0xff800000, 0x7f800001, 0xffc00000, 0x7fffffff,
		0x7f7fffff, 0xff7fffff, 0x00000001, 0x807fffff, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff}
	for len(bits) < 1000 {
		bits = append(bits, rng.Uint32())
	}
	src := make([]float32, len(bits))
	for i, b := range bits {
		src[i] = math.Float32frombits(b)
	}
	for _, n := range []int{0, 15, 16, 17, 1000} {
		got := make([]uint16, n)
		roundBF16(got, src[:n])
		for i, v := range src[:n] {
			if want := kernels.F32ToBF16(v); got[i] != want {
				t.Fatalf("n=%d: %#08x rounds to %#04x, want %#04x", n, bits[i], got[i], want)
			}
		}
	}
}

// BenchmarkBF16Tile is BenchmarkTile for the VDPBF16PS tiles (k = 1024, in
// L1, one core, thread CPU time).
func BenchmarkBF16Tile(b *testing.B) {
	if asmBF16Tiles() == nil {
		b.Skip("no AVX-512 BF16")
	}
	for _, sh := range []struct {
		r, c int
		f    bf16TileFunc
	}{{1, 1, vdpbf16Tiles.r1c1}, {1, 4, vdpbf16Tiles.r1c4}, {4, 4, vdpbf16Tiles.r4c4}} {
		b.Run(fmt.Sprintf("R%dC%d", sh.r, sh.c), func(b *testing.B) {
			const k = 1024
			x := make([]uint16, 4*k)
			w := make([]byte, 4*k*2)
			y := make([]float32, 16)
			cpuLoop(b, func() { sh.f(y, 4, x, k, w, k, k) })
			b.ReportMetric(float64(2*sh.r*sh.c*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestAMXMatchesGo checks the AMX block product and the 16×16 transpose
// against their Go twins: random bf16 weights and packed x, nb blocks,
// and every row count of the transpose.
func TestAMXMatchesGo(t *testing.T) {
	if asmAMX() == nil {
		t.Skip("no AMX")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, k := range []int{32, 64, 1024} {
		for _, nb := range []int{1, 3} {
			ldw := 2*k + 64 // bytes; a gap between weight rows
			w := make([]byte, 32*ldw)
			for i := 0; i < len(w); i += 2 {
				v := kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
				w[i], w[i+1] = byte(v), byte(v>>8)
			}
			xg := k * 8
			x := make([]uint32, 2*nb*xg)
			for i := range x {
				lo := kernels.F32ToBF16(float32(rng.NormFloat64()))
				hi := kernels.F32ToBF16(float32(rng.NormFloat64()))
				x[i] = uint32(lo) | uint32(hi)<<16
			}
			got, want := make([]float32, nb*1024), make([]float32, nb*1024)
			amxBF16(got, w, ldw, x, xg, nb, k, &amxCfg)
			amxBF16Go(want, w, ldw, x, xg, nb, k, nil)
			for i := range got {
				// Exact products; float32 sums in another order.
				if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5*math.Sqrt(float64(k))) {
					t.Fatalf("k=%d nb=%d: c[%d] = %g, Go twin %g", k, nb, i, got[i], want[i])
				}
			}
		}
	}
	src := make([]uint32, 16*20)
	for i := range src {
		src[i] = rng.Uint32()
	}
	for n := range 17 {
		got, want := make([]uint32, 16*24), make([]uint32, 16*24)
		transpose16(got, 24, src, 20, n)
		transpose16Go(want, 24, src, 20, n)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("transpose16 n=%d: dst[%d] = %#x, want %#x", n, i, got[i], want[i])
			}
		}
	}
}
