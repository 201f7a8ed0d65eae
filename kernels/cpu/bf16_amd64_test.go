//go:build !noasm

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
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

// TestGemmTilesMatchGo checks every gemm tile (r ≤ 4 x rows, c ≤ 6 weight
// rows) against its Go twin, writing and adding (acc), for every column
// count mod 32, with NaN right after each weight row's k columns (the
// masked tail must not read it), NaN in y past the tile's columns (it must
// not be written) and x padded as the driver pads it.
func TestGemmTilesMatchGo(t *testing.T) {
	if cpuinfo.AMX() || asmBF16Tiles() == nil {
		t.Skip("no gemm tiles on this CPU")
	}
	g, gg := vdpbf16GemmTiles.gemm, genericGemmTiles
	if g.R != gg.R || g.C != gg.C {
		t.Fatalf("gemm tiles %d×%d, Go twin %d×%d", g.R, g.C, gg.R, gg.C)
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for _, k := range []int{0, 1, 31, 32, 33, 64, 100, 257, 1024, 1055} {
		for r := 1; r <= g.R; r++ {
			for c := 1; c <= g.C; c++ {
				for _, acc := range []int{0, 1} {
					ld := (k + 31) &^ 31
					var xr bf16Rows
					xr.resize(r, k)
					x := make([]float32, r*k)
					for i := range x {
						x[i] = float32(rng.NormFloat64())
					}
					xr.roundRows(x, k, 0, r)
					ldw := k + 3
					w := make([]byte, 2*(c*ldw))
					for i := range c * ldw {
						v := uint16(0x7fc1) // NaN
						if i%ldw < k {
							v = kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
						}
						w[2*i], w[2*i+1] = byte(v), byte(v>>8)
					}
					const ldy = 9
					got, want := make([]float32, r*ldy), make([]float32, r*ldy)
					for i := range got {
						got[i] = float32(math.NaN())
						if i%ldy < c {
							got[i] = float32(rng.NormFloat64())
						}
					}
					copy(want, got)
					g.t[r-1][c-1](got, ldy, xr.x, ld, w, ldw, k, acc)
					gg.t[r-1][c-1](want, ldy, xr.x, ld, w, ldw, k, acc)
					for i := range r {
						for j := range ldy {
							gv, wv := got[i*ldy+j], want[i*ldy+j]
							if j >= c {
								if !math.IsNaN(float64(gv)) {
									t.Fatalf("k=%d R%dC%d acc=%d: y[%d, %d] written (%g)", k, r, c, acc, i, j, gv)
								}
								continue
							}
							abs := math.Abs(float64(want[i*ldy+j]))
							for e := range k {
								abs += math.Abs(float64(kernels.BF16ToF32(xr.x[i*ld+e]) * bf16At(w[2*j*ldw:], e)))
							}
							if d := math.Abs(float64(gv - wv)); !(d <= abs/(1<<18)) {
								t.Fatalf("k=%d R%dC%d acc=%d: y[%d, %d] = %g, Go twin %g (|Σ| %g)", k, r, c, acc, i, j, gv, wv, abs)
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkGemmTile is BenchmarkBF16Tile for the gemm tiles (k = 1024, in
// L1, one core, thread CPU time), against the 4×4 VDPBF16PS tile.
func BenchmarkGemmTile(b *testing.B) {
	if cpuinfo.AMX() || asmBF16Tiles() == nil {
		b.Skip("no gemm tiles on this CPU")
	}
	g := vdpbf16GemmTiles.gemm
	for _, sh := range []struct{ r, c int }{{4, 4}, {4, 6}, {3, 6}, {2, 6}, {1, 6}} {
		b.Run(fmt.Sprintf("R%dC%d", sh.r, sh.c), func(b *testing.B) {
			const k = 1024
			x := make([]uint16, 8*k)
			w := make([]byte, 8*k*2)
			y := make([]float32, 64)
			f := g.t[sh.r-1][sh.c-1]
			cpuLoop(b, func() { f(y, 8, x, k, w, k, k, 0) })
			b.ReportMetric(float64(sh.r*sh.c*k)/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "GMAC/s")
		})
	}
}

// TestGemmRowsIndependentOfGrouping: on the gemm tiles a product's bits do
// not depend on which tile computed it: weight rows stacked (fused gate/up)
// give the bits of separate matrices, and an x row gives the same bits in
// a batch of 5 as in one of 37, across the column chunks (cols > gemmKC).
func TestGemmRowsIndependentOfGrouping(t *testing.T) {
	if bf16TilesFor() == nil || bf16TilesFor().gemm == nil {
		t.Skip("no gemm tiles on this CPU")
	}
	rng := rand.New(rand.NewPCG(6, 2))
	b := New(2)
	defer b.Close()
	b.SetBF16Activations(true)
	for _, cols := range []int{512, gemmKC + 77} {
		w1, w2 := kerneltest.NewMat(rng, kernels.BF16, 13, cols, 0, 0), kerneltest.NewMat(rng, kernels.BF16, 11, cols, 0, 0)
		st := &kernels.Mat{DType: kernels.BF16, Rows: 24, Cols: cols, Data: append(append([]byte(nil), w1.Data...), w2.Data...)}
		x := make([]float32, 37*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		var first []float32
		for _, n := range []int{5, 37} {
			y1, y2, ys := make([]float32, n*13), make([]float32, n*11), make([]float32, n*24)
			b.MatMul(y1, x, w1, n)
			b.MatMul(y2, x, w2, n)
			b.MatMul(ys, x, st, n)
			for i := range n {
				for j := range 24 {
					want := ys[i*24+j]
					got := y1[i*13+min(j, 12)]
					if j >= 13 {
						got = y2[i*11+j-13]
					}
					if math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("cols=%d n=%d: y[%d, %d] = %g alone, %g stacked", cols, n, i, j, got, want)
					}
				}
			}
			if first == nil {
				first = ys
				continue
			}
			for i := range first {
				if math.Float32bits(first[i]) != math.Float32bits(ys[i]) {
					t.Fatalf("cols=%d: y[%d, %d] = %g in a batch of 5, %g in one of %d", cols, i/24, i%24, first[i], ys[i], n)
				}
			}
		}
	}
}

// TestGemvMatchesGo checks the gemv kernels against their Go twin for
// every column count mod 32 and a few row counts, NaN right after each
// weight row's k columns and past y's rows.
func TestGemvMatchesGo(t *testing.T) {
	if !cpuinfo.BF16() {
		t.Skip("no AVX-512 BF16")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for name, f := range map[string]gemvFunc{"P0": gemvBF16, "P4096": gemvBF16P4096} {
		for _, k := range []int{0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 1024, 1055} {
			for _, rows := range []int{0, 1, 3, 17} {
				ld := (k + 31) &^ 31
				var xr bf16Rows
				xr.resize(1, k)
				x := make([]float32, k)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				xr.roundRows(x, k, 0, 1)
				ldw := k + 3
				w := make([]byte, 2*rows*ldw)
				for i := range rows * ldw {
					v := uint16(0x7fc1) // NaN
					if i%ldw < k {
						v = kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
					}
					w[2*i], w[2*i+1] = byte(v), byte(v>>8)
				}
				got, want := make([]float32, rows+1), make([]float32, rows)
				got[rows] = float32(math.NaN())
				f(got, xr.x[:ld], w, ldw, k, rows)
				gemvGo(want, xr.x[:ld], w, ldw, k, rows)
				if !math.IsNaN(float64(got[rows])) {
					t.Fatalf("%s k=%d rows=%d: y[rows] written", name, k, rows)
				}
				for j := range rows {
					var abs float64
					for i := range k {
						abs += math.Abs(float64(kernels.BF16ToF32(xr.x[i]) * bf16At(w[2*j*ldw:], i)))
					}
					if d := math.Abs(float64(got[j] - want[j])); !(d <= abs/(1<<18)) {
						t.Fatalf("%s k=%d rows=%d: y[%d] = %g, Go twin %g (|Σ| %g)", name, k, rows, j, got[j], want[j], abs)
					}
				}
			}
		}
	}
}

// BenchmarkGemvCold streams 1 GiB of BF16 weight matrices (decode: 4096
// rows of 1024 columns each) through MatMul on two workers with each gemv
// kernel: the memory rate of a decode step's products.
func BenchmarkGemvCold(b *testing.B) {
	if !cpuinfo.BF16() || cpuinfo.AMX() {
		b.Skip("no gemv path on this CPU")
	}
	const rows, cols = 4096, 1024
	per := rows * cols * 2
	buf := make([]byte, 1<<30)
	for i := 0; i < len(buf); i += 2 { // normal numbers, ±(1..2)·2⁻⁴
		v := kernels.F32ToBF16(float32(int(i%509)-254) / 4096)
		buf[i], buf[i+1] = byte(v), byte(v>>8)
	}
	ws := make([]*kernels.Mat, len(buf)/per)
	for i := range ws {
		ws[i] = &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols, Data: buf[i*per : (i+1)*per]}
	}
	x, y := make([]float32, cols), make([]float32, rows)
	old := vdpbf16GemmTiles.gemv
	defer func() { vdpbf16GemmTiles.gemv = old }()
	for _, v := range []struct {
		name string
		f    gemvFunc
	}{{"r1c1", nil}, {"P0", gemvBF16}, {"P4096", gemvBF16P4096}} {
		b.Run(v.name, func(b *testing.B) {
			vdpbf16GemmTiles.gemv = v.f
			be := New(2)
			defer be.Close()
			be.SetBF16Activations(true)
			b.SetBytes(int64(per))
			i := 0
			for b.Loop() {
				be.MatMul(y, x, ws[i], 1)
				i = (i + 1) % len(ws)
			}
		})
	}
}

// TestPVPairsMatchGo checks pairBF16 (bit-exact) and the pvPairs and
// qkPairs kernels (the float32 sums in another order) against their Go
// twins, with NaN in o past the 64 columns and rows (they must not be
// written).
func TestPVPairsMatchGo(t *testing.T) {
	if !cpuinfo.BF16() {
		t.Skip("no AVX-512 BF16")
	}
	rng := rand.New(rand.NewPCG(13, 14))
	rnd := func(n int, s float64) []uint16 {
		v := make([]uint16, n)
		for i := range v {
			v[i] = kernels.F32ToBF16(float32(s * rng.NormFloat64()))
		}
		return v
	}
	for _, n := range []int{0, 32, 128, 256} {
		a, b := u16Bytes(rnd(n, 1)), u16Bytes(rnd(n, 1))
		got, want := make([]uint16, 2*n+1), make([]uint16, 2*n+1)
		pairBF16(got, a, b, n)
		pairGo(want, a, b, n)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("pairBF16 n=%d: dst[%d] = %#x, want %#x", n, i, got[i], want[i])
			}
		}
	}
	const ldo, ldp, ldv = 70, 45, 130
	for rows := 1; rows <= 4; rows++ {
		for _, np := range []int{0, 1, 2, 7, 20, 21} {
			p, vp := rnd(rows*ldp, 0.3), rnd(np*ldv, 1)
			got := make([]float32, rows*ldo)
			for i := range got {
				got[i] = float32(math.NaN())
				if i%ldo < 64 {
					got[i] = float32(rng.NormFloat64())
				}
			}
			want := append([]float32(nil), got...)
			add := np%2 == 0 // the pvPairs kernels for even np, the qkPairs ones for odd
			f := vdpbf16GemmTiles.pv[rows-1]
			if !add {
				f = vdpbf16GemmTiles.qk[rows-1]
			}
			f(got, ldo, p, ldp, vp, ldv, np)
			pvPairsGo(rows, add)(want, ldo, p, ldp, vp, ldv, np)
			for r := range rows {
				for d := range ldo {
					g, w := got[r*ldo+d], want[r*ldo+d]
					if d >= 64 {
						if !math.IsNaN(float64(g)) {
							t.Fatalf("R%d np=%d: o[%d, %d] written", rows, np, r, d)
						}
						continue
					}
					abs := math.Abs(float64(w))
					for j := range 2 * np {
						abs += math.Abs(float64(kernels.BF16ToF32(p[r*ldp+j]) * kernels.BF16ToF32(vp[j/2*ldv+2*d+j%2])))
					}
					if diff := math.Abs(float64(g - w)); !(diff <= abs/(1<<18)) {
						t.Fatalf("R%d np=%d: o[%d, %d] = %g, Go twin %g", rows, np, r, d, g, w)
					}
				}
			}
		}
	}
}

// BenchmarkGemvPlacement streams 512 MiB of BF16 weights (rows of 1024
// columns) through each gemv kernel on one thread, from Go heap memory (4
// KiB pages) and from hugeBytes (transparent huge pages): the choice of
// residentCache and of vdpbf16GemmTiles.gemvHuge. cpu-ns/op is the
// thread's CPU time (on a shared machine the wall time includes others').
func BenchmarkGemvPlacement(b *testing.B) {
	if !cpuinfo.BF16() {
		b.Skip("no AVX-512 BF16")
	}
	const size, cols, task = 512 << 20, 1024, 256 // bytes, columns, rows a call
	heap, huge := make([]byte, size), hugeBytes(size)
	for i := 0; i < size; i += 2 {
		v := kernels.F32ToBF16(float32(int(i%509)-254) / 4096)
		heap[i], heap[i+1] = byte(v), byte(v>>8)
	}
	copy(huge, heap)
	x := make([]uint16, cols)
	for i := range x {
		x[i] = kernels.F32ToBF16(1)
	}
	y := make([]float32, task)
	for _, mem := range []struct {
		name string
		w    []byte
	}{{"heap", heap}, {"huge", huge}} {
		for _, k := range []struct {
			name string
			f    gemvFunc
		}{{"P0", gemvBF16}, {"P4096", gemvBF16P4096}} {
			b.Run(mem.name+"/"+k.name, func(b *testing.B) {
				b.SetBytes(size)
				cpuLoop(b, func() {
					for r0 := 0; r0 < size/(2*cols); r0 += task {
						k.f(y, x, mem.w[2*r0*cols:2*(r0+task)*cols], cols, cols, task)
					}
				})
			})
		}
	}
}
