package cpu

import (
	"os"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// BF16 weights on a CPU with AVX-512 BF16 take a second path: MatMul rounds
// each x row to bfloat16 once (ties to even), and the tiles multiply bf16 by
// bf16 with VDPBF16PS, 32 columns and 64 multiply-adds per instruction and
// no widening of the weights. The products are exact in float32; what
// changes against the float32 path is x itself, each element off by at most
// 2⁻⁹ of its magnitude, so y[i, j] may differ from the float32 product by
// up to 2⁻⁸·Σₖ|x[i,k]·w[j,k]| (about 2⁻⁹·√k times the typical term for
// random signs). Which calls take this path is bf16MaxRows's choice.
// Prefill attention over a BF16 cache uses it too (tileAMX), for its
// products of queries and probabilities with the cached keys and values.

// bf16Rows is a batch of x rows rounded to bfloat16, each padded with zeros
// to ld columns, a multiple of 32, because the tiles read whole 32-column
// chunks of x.
type bf16Rows struct {
	x  []uint16 // (n, ld) bfloat16 bit patterns
	ld int
}

// resize makes r hold n rows of cols columns, growing its buffer.
func (r *bf16Rows) resize(n, cols int) {
	r.ld = (cols + 31) &^ 31
	if cap(r.x) < n*r.ld {
		r.x = make([]uint16, n*r.ld)
	}
	r.x = r.x[:n*r.ld]
}

// roundRows rounds rows [lo, hi) of x (rows of cols) into r, which resize
// has sized.
func (r *bf16Rows) roundRows(x []float32, cols, lo, hi int) {
	for i := lo; i < hi; i++ {
		d := r.x[i*r.ld : (i+1)*r.ld]
		roundBF16(d[:cols], x[i*cols:(i+1)*cols])
		clear(d[cols:])
	}
}

// roundBF16Go sets dst[i] = kernels.F32ToBF16(src[i]) for i < len(src).
func roundBF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = kernels.F32ToBF16(v)
	}
}

// A bf16TileFunc is a tileFunc whose x rows are bfloat16, zero-padded to a
// multiple of 32 columns:
//
//	y[r*ldy+c] = Σᵢ<k BF16ToF32(x[r*ldx+i]) · BF16ToF32(w row c, column i)
type bf16TileFunc func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int)

// bf16TileSet holds the tile shapes of the bf16 path: one x row against one
// weight row (decode streams the weights row by row), one against four
// (the x rows prefill leaves over), four against four (prefill); and, where
// VDPBF16PS runs at full rate, the gemm tiles, which then take every call
// of two or more x rows (btask).
type bf16TileSet struct {
	r1c1, r1c4, r4c4 bf16TileFunc
	gemm             *gemmTileSet
	gemv             gemvFunc // one x row against a block of weight rows, or nil
	gemvHuge         gemvFunc // the same for weights in huge pages (residentCache), or nil: gemv

	// Prefill attention's P·V as outer products (attention.go, pvVDP),
	// with the gemm tiles: two value rows interleaved, and 1 to 4
	// probability rows against the pairs.
	pair func(dst []uint16, a, b []byte, n int)
	pv   [4]pvPairsFunc
	// Its scores Q·Kᵀ the same way: the keys transposed as dwords (pairs
	// of head dims), the products written.
	transpose func(dst []uint32, ldd int, src []uint32, lds int, n int)
	qk        [4]pvPairsFunc
}

// A pvPairsFunc adds rows (its index + 1) bfloat16 probability rows times
// the paired value rows to 64 columns of o (see pvPairsR4).
type pvPairsFunc func(o []float32, ldo int, p []uint16, ldp int, vp []uint16, ldv int, npairs int)

// pairGo is the pure-Go twin of pairBF16: dst[2i], dst[2i+1] = a[i], b[i]
// for i < n, a and b little-endian bfloat16 bytes.
func pairGo(dst []uint16, a, b []byte, n int) {
	for i := range n {
		dst[2*i] = uint16(a[2*i]) | uint16(a[2*i+1])<<8
		dst[2*i+1] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
}

// pvPairsGo returns the pure-Go twin of the pvPairs kernel of rows rows
// (add), or of the qkPairs one (!add: o written).
func pvPairsGo(rows int, add bool) pvPairsFunc {
	return func(o []float32, ldo int, p []uint16, ldp int, vp []uint16, ldv int, npairs int) {
		for r := range rows {
			for d := range 64 {
				var s float32
				for j := range npairs {
					s += kernels.BF16ToF32(p[r*ldp+2*j])*kernels.BF16ToF32(vp[j*ldv+2*d]) +
						kernels.BF16ToF32(p[r*ldp+2*j+1])*kernels.BF16ToF32(vp[j*ldv+2*d+1])
				}
				if add {
					s += o[r*ldo+d]
				}
				o[r*ldo+d] = s
			}
		}
	}
}

// A gemvFunc sets y[j] = Σᵢ<k x[i]·w[j*ldw+i] for j < rows (see gemvBF16).
type gemvFunc func(y []float32, x []uint16, w []byte, ldw, k, rows int)

// gemvGo is the pure-Go twin of the gemv kernels.
func gemvGo(y []float32, x []uint16, w []byte, ldw, k, rows int) {
	for j := range rows {
		y[j] = dotBF16xBF16(x[:k], w[2*j*ldw:])
	}
}

// A gemmTileFunc is a bf16TileFunc that adds its sums to y when acc ≠ 0
// (see gemmBF16R4C6), so a caller can cut k into chunks.
type gemmTileFunc func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int, acc int)

// gemmTileSet is the (r, c) tiles for every r ≤ R x rows and c ≤ C weight
// rows: t[r-1][c-1]. Each (x row, weight row) sum runs the same
// instructions in the same order whatever tile holds it, so a row's result
// does not depend on how rows are grouped (fused weights give the bits of
// separate ones).
type gemmTileSet struct {
	R, C int
	t    [][]gemmTileFunc
}

// gemmKC is the most columns one pass of the gemm tiles takes (longer rows
// go in equal chunks of at most that many, each pass adding its sums to
// y), so that a block of weight rows (weightBlock bytes) and a tile's x rows
// stay in L1 together. BenchmarkBF16GEMM on Zen 5, thread CPU time, n = 512:
// 1024×2048 at 2048 columns a pass 131-153 GMAC/s, at 1024 112-135;
// 1024×3072 one pass 120-131, three of 1024 130-150, two of 1536 118-152.
var gemmKC = 2048

// genericGemmTiles is the pure-Go twin of the gemm tiles (4×6, the shape
// kernels/_generate/bf16gemm.go generates), summing in another order.
var genericGemmTiles = func() *gemmTileSet {
	g := &gemmTileSet{R: 4, C: 6}
	for r := 1; r <= g.R; r++ {
		var row []gemmTileFunc
		for c := 1; c <= g.C; c++ {
			row = append(row, func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int, acc int) {
				for i := range r {
					for j := range c {
						s := dotBF16xBF16(x[i*ldx:i*ldx+k], w[2*j*ldw:])
						if acc != 0 {
							s += y[i*ldy+j]
						}
						y[i*ldy+j] = s
					}
				}
			})
		}
		g.t = append(g.t, row)
	}
	return g
}()

// genericBF16Tiles are the pure-Go twin of the VDPBF16PS tiles: the same
// products (exact in float32), summed in another order.
var genericBF16Tiles = bf16TileSet{
	gemm:      genericGemmTiles,
	gemv:      gemvGo,
	pair:      pairGo,
	pv:        [4]pvPairsFunc{pvPairsGo(1, true), pvPairsGo(2, true), pvPairsGo(3, true), pvPairsGo(4, true)},
	transpose: transpose16Go,
	qk:        [4]pvPairsFunc{pvPairsGo(1, false), pvPairsGo(2, false), pvPairsGo(3, false), pvPairsGo(4, false)},
	r1c1: func(y []float32, _ int, x []uint16, _ int, w []byte, _ int, k int) {
		y[0] = dotBF16xBF16(x[:k], w)
	},
	r1c4: func(y []float32, _ int, x []uint16, _ int, w []byte, ldw int, k int) {
		for c := range 4 {
			y[c] = dotBF16xBF16(x[:k], w[2*c*ldw:])
		}
	},
	r4c4: func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int) {
		for r := range 4 {
			for c := range 4 {
				y[r*ldy+c] = dotBF16xBF16(x[r*ldx:r*ldx+k], w[2*c*ldw:])
			}
		}
	},
}

// dotBF16xBF16 is Σ x[i]·w[i] over len(x) elements, both bfloat16.
func dotBF16xBF16(x []uint16, w []byte) float32 {
	w = w[:2*len(x)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		s0 += kernels.BF16ToF32(x[i]) * bf16At(w, i)
		s1 += kernels.BF16ToF32(x[i+1]) * bf16At(w, i+1)
	}
	if i < len(x) {
		s0 += kernels.BF16ToF32(x[i]) * bf16At(w, i)
	}
	return s0 + s1
}

// bf16MaxRows is the most x rows a MatMul may have to take the bf16 path
// on a CPU with AMX. There (a Sapphire Rapids Xeon) VDPBF16PS runs at
// about half the rate of two float32 FMAs (BenchmarkBF16Tile: the 4×4 tile
// takes 308 ns of CPU per call at k = 1024, the float32 one 254), so it
// gains only where the float32 tiles spend their time widening weights:
// one x row (28 against 40 ns for 1×1), and two or three (about equal);
// AMX takes 8 rows and more. Without AMX (AMD Zen 4 and 5) VDPBF16PS does
// twice the multiply-adds of an FMA per cycle (Zen 5: the 4×4 tile 84
// against 175 ns of CPU for the float32 one; BenchmarkBF16GEMM at n = 512
// 2.0-2.3× the float32 tiles), so every row count takes the bf16 path.
const bf16MaxRows = 3

// bf16GemmOff keeps BF16 weights on the float32 tiles from four x rows on
// also where VDPBF16PS runs at full rate, without the gemm tiles, the gemv
// kernel and the VDPBF16PS attention (FERRITE_CPU_BF16GEMM=0 in the
// environment: the rule of a CPU with AMX), so one build can run both.
var bf16GemmOff atomic.Bool

// gemmTilesOff makes btask run the 4×4 tile instead of the gemm tiles (the
// benchmarks that compare them).
var gemmTilesOff atomic.Bool

func init() { bf16GemmOff.Store(os.Getenv("FERRITE_CPU_BF16GEMM") == "0") }

// forceGenericBF16 makes bf16TilesFor return the pure-Go twin, so the bf16
// path's driver can be tested without the instruction (ForceGenericBF16).
var forceGenericBF16 atomic.Bool

// bf16TilesFor returns the bf16 path's tiles, or nil where it is off: the
// VDPBF16PS tiles where the CPU has AVX-512 BF16, else none.
func bf16TilesFor() *bf16TileSet {
	if forceGenericBF16.Load() {
		return &genericBF16Tiles
	}
	return asmBF16Tiles()
}

// The paths a BF16 weight can take.
const (
	pathF32  = iota // x as float32, weights widened (the float tiles)
	pathBF16        // x rounded to bfloat16, VDPBF16PS tiles
	pathAMX         // x rounded to bfloat16 and packed, AMX tiles
)

// bf16Path returns the path MatMul with weight w over n rows takes on this
// CPU, where rounding x to bfloat16 is allowed (on, see
// Backend.SetBF16Activations). Quantized weights take pathAMX or their
// int8 tiles (pathF32 here).
func bf16Path(w *kernels.Mat, n int, on bool) int {
	switch {
	case !on:
		return pathF32
	case (w.DType == kernels.BF16 || w.DType.Quantized()) && usesAMX(w, n):
		return pathAMX
	case w.DType != kernels.BF16:
		return pathF32
	case (n <= bf16MaxRows || amxKernelsFor() == nil && !bf16GemmOff.Load()) && bf16TilesFor() != nil:
		return pathBF16
	}
	return pathF32
}

// btask is task for the bf16 path: output rows [r0, r1) for x rows
// [i0, i1), weight rows blocked in L1 as in task.
func (m *matmul) btask(r0, r1, i0, i1 int) {
	cols, ldy := m.w.Cols, m.ldy
	step := r1 - r0
	if i1-i0 > 1 {
		step = max(4, weightBlock/max(2*cols, 1)&^3)
	}
	t, x, ld, data := m.bt, m.xb.x, m.xb.ld, m.wd
	if t.gemm != nil && i1-i0 > 1 && !gemmTilesOff.Load() {
		m.gemmTask(r0, r1, i0, i1)
		return
	}
	if m.gemv != nil && i1-i0 == 1 {
		m.gemv(m.y[i0*ldy+r0:i0*ldy+r1], x[i0*ld:(i0+1)*ld], data[2*r0*cols:2*r1*cols], cols, cols, r1-r0)
		return
	}
	for s0 := r0; s0 < r1; s0 += step {
		s1 := min(r1, s0+step)
		for i := i0; i < i1; {
			xi, yi := x[i*ld:], m.y[i*ldy:]
			j := s0
			if i+4 <= i1 {
				for ; j+4 <= s1; j += 4 {
					t.r4c4(yi[j:], ldy, xi, ld, data[2*j*cols:], cols, cols)
				}
				for r := range 4 {
					for c := j; c < s1; c++ {
						t.r1c1(yi[r*ldy+c:], ldy, xi[r*ld:], ld, data[2*c*cols:], cols, cols)
					}
				}
				i += 4
				continue
			}
			if i1-i0 > 1 { // prefill's last rows; decode streams row by row
				for ; j+4 <= s1; j += 4 {
					t.r1c4(yi[j:], ldy, xi, ld, data[2*j*cols:], cols, cols)
				}
			}
			for ; j < s1; j++ {
				t.r1c1(yi[j:], ldy, xi, ld, data[2*j*cols:], cols, cols)
			}
			i++
		}
	}
}

// gemmTask is btask on the gemm tiles: for each block of weight rows
// (weightBlock bytes of gemmKC columns) and each chunk of gemmKC columns,
// every x row of the task goes past the block, R rows by C weight rows a
// tile, the rows left over in smaller tiles; the chunks after the first
// add to y.
func (m *matmul) gemmTask(r0, r1, i0, i1 int) {
	cols, ldy, g := m.w.Cols, m.ldy, m.bt.gemm
	kc := 32 // equal chunks of at most gemmKC columns
	if cols > 0 {
		kc = roundUp(ceilDiv(cols, ceilDiv(cols, gemmKC)), 32)
	}
	step := max(g.C, weightBlock/(2*kc)/g.C*g.C)
	x, ld, data := m.xb.x, m.xb.ld, m.wd
	for s0 := r0; s0 < r1; s0 += step {
		s1 := min(r1, s0+step)
		for k0 := 0; k0 == 0 || k0 < cols; k0 += kc { // once for cols = 0: y = 0
			kn, acc := min(kc, cols-k0), 0
			if k0 > 0 {
				acc = 1
			}
			for i := i0; i < i1; i += g.R {
				r := min(g.R, i1-i)
				xi, yi := x[i*ld+k0:], m.y[i*ldy:]
				for j := s0; j < s1; j += g.C {
					g.t[r-1][min(g.C, s1-j)-1](yi[j:], ldy, xi, ld, data[2*(j*cols+k0):], cols, kn, acc)
				}
			}
		}
	}
}
