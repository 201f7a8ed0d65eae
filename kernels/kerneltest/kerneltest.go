// Package kerneltest is the conformance suite every kernels.Backend runs.
// A backend's test is one line:
//
//	func TestConformance(t *testing.T) { kerneltest.Run(t, cpu.New(0)) }
//
// MatMul is checked against kernels.MatMulRef for every dtype over many
// shapes (n = 0, 1, odd sizes, tile remainders, F8 block shapes that do not
// divide the matrix), with guard bands around every buffer: y's guards must
// stay bit-identical, y's body starts poisoned with NaN so every element must
// be written, and x's and w's guards hold NaN so an out-of-bounds read shows
// up in the result. Parallel must visit every index exactly once.
//
// Block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) run over QuantShapes
// (whole blocks) from random valid blocks, against the exact dequantization
// times float32 x, with a tolerance that allows a backend to quantize x to
// int8 as llama.cpp does (see QuantTol).
package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Tol is the MatMul tolerance relative to the absolute dot product:
//
//	|got − want| ≤ Tol · Σₖ |x[i,k]·w[j,k]|
//
// where want is kernels.MatMulRef (float64 sums). 2⁻¹⁶ ≈ 1.5e-5 leaves room
// for any float32 summation order at the sizes tested (k ≤ 1100; the CPU
// backend's worst case is 2.6e-7 with assembly, 5.3e-7 in pure Go), yet one
// missing or doubled term of typical size is ~1/k of the sum and fails.
const Tol = 1.0 / (1 << 16)

// Run runs the whole suite against b as subtests.
func Run(t *testing.T, b kernels.Backend) {
	t.Run("MatMul", func(t *testing.T) { MatMulTest(t, b) })
	t.Run("MatMulArgs", func(t *testing.T) { MatMulArgsTest(t, b) })
	t.Run("MatMulTransient", func(t *testing.T) { MatMulTransientTest(t, b) })
	t.Run("Parallel", func(t *testing.T) { ParallelTest(t, b) })
}

// A Shape is one MatMul case: y (N, Rows) = x (N, Cols) · wᵀ; BlockRows and
// BlockCols apply to F8E4M3 only.
type Shape struct {
	N, Rows, Cols        int
	BlockRows, BlockCols int
}

// Shapes are the MatMul cases, chosen to hit every tile remainder (rows mod
// 4, x rows mod 2, columns mod 8 and mod 16), tiny and empty operands, and
// the task splits of a multi-threaded backend (n > 64, many rows).
var Shapes = []Shape{
	{0, 4, 4, 128, 128},
	{1, 1, 1, 128, 128},
	{1, 1, 7, 128, 128},
	{2, 3, 0, 128, 128},
	{1, 4, 8, 1, 1},
	{1, 5, 9, 2, 4},
	{1, 3, 17, 128, 128},
	{2, 4, 16, 3, 5},
	{3, 7, 33, 4, 16},
	{1, 64, 64, 128, 128},
	{1, 33, 129, 7, 32},
	{5, 19, 250, 16, 64},
	{2, 130, 131, 128, 128},
	{8, 64, 256, 32, 128},
	{1, 1023, 257, 128, 128},
	{1, 256, 1100, 128, 128},
	{17, 67, 95, 5, 6},
	{64, 96, 160, 128, 128},
	{67, 41, 72, 8, 8},
	{130, 21, 24, 128, 128},
	// Whole 32-column chunks and 16+ x rows: a CPU's AMX path, with
	// partial blocks of x rows and of weight rows.
	{16, 32, 32, 128, 128},
	{33, 95, 64, 16, 16},
	{100, 64, 96, 128, 128},
}

// DTypes are the weight dtypes MatMul must support.
var DTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3,
	kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q5K, kernels.Q6K}

// QuantShapes are the MatMul cases for block-quantized weights: Cols is a
// multiple of 256 (every quantized type's block), Rows and N cover the same
// remainders and task splits as Shapes.
var QuantShapes = []Shape{
	{0, 4, 256, 0, 0},
	{2, 3, 0, 0, 0},
	{1, 1, 256, 0, 0},
	{1, 7, 512, 0, 0},
	{2, 3, 256, 0, 0},
	{3, 9, 768, 0, 0},
	{5, 33, 256, 0, 0},
	{1, 130, 1024, 0, 0},
	{4, 64, 512, 0, 0},
	{17, 67, 256, 0, 0},
	{1, 1023, 256, 0, 0},
	{67, 41, 512, 0, 0},
	{130, 21, 256, 0, 0},
	{72, 9, 1024, 0, 0},  // enough x for a backend to quantize it in parallel
	{130, 40, 256, 0, 0}, // a CPU's AMX path: a block of 32 weight rows and 8 more
}

// QuantTol is how far a quantized MatMul may stray from the reference beyond
// Tol: the backend may round each x block of 32 columns (256 for the
// K-quants Q4_K, Q5_K and Q6_K, as llama.cpp's Q8_K does) to int8 with
// scale d = max|x|/127, an error uniform in ±d/2 per element, so y[i, j]
// may be off by QuantSigmas standard deviations of Σₖ w[j,k]·eₖ:
//
//	QuantSigmas · √(Σₖ w[j,k]²·d(i,k)²/12)
//
// One missing or doubled block of 32 columns is ~10× that at the sizes tested.
const QuantSigmas = 8

const guard = 16 // elements (bytes for w) of guard band on each side

var (
	yGuard  = math.Float32frombits(0x7fa5a5a5) // y's guard bands, must survive bit for bit
	yPoison = math.Float32frombits(0x7fc0dead) // y's body before the call
	xGuard  = float32(math.NaN())
)

// MatMulTest checks b.MatMul against kernels.MatMulRef for every dtype and
// shape, with guard bands and poisoned outputs (see the package comment).
func MatMulTest(t *testing.T, b kernels.Backend) {
	for _, dt := range DTypes {
		shapes := Shapes
		if dt.Quantized() {
			shapes = QuantShapes
		}
		for si, s := range shapes {
			name := fmt.Sprintf("%v/n=%d,%dx%d", dt, s.N, s.Rows, s.Cols)
			if dt == kernels.F8E4M3 {
				name += fmt.Sprintf(",block=%dx%d", s.BlockRows, s.BlockCols)
			}
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(dt), uint64(si)))
				// An odd offset for every other case checks unaligned weights.
				w := newGuardedMat(rng, dt, s, si%2)
				xbuf := guarded(s.N*s.Cols, xGuard)
				x := xbuf[guard : guard+s.N*s.Cols]
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				ybuf := guarded(s.N*s.Rows, yGuard)
				y := ybuf[guard : guard+s.N*s.Rows]
				for i := range y {
					y[i] = yPoison
				}

				b.MatMul(y, x, w.Mat, s.N)

				checkGuard(t, "y", ybuf, len(y))
				w.check(t)
				xr, rounded := RoundX(b, x, w.Mat, s.N)
				want, abs, qtol := reference(refKey{dt, s, si, rounded}, xr, w.Mat)
				bad := 0
				for i := range y {
					tol := Tol*abs[i] + qtol[i]
					if d := math.Abs(float64(y[i]) - float64(want[i])); !(d <= tol) {
						if bad++; bad <= 5 {
							t.Errorf("y[%d, %d] = %g (bits %#08x), want %g ± %.3g",
								i/max(s.Rows, 1), i%max(s.Rows, 1), y[i], math.Float32bits(y[i]), want[i], tol)
						}
					}
				}
				if bad > 5 {
					t.Errorf("... %d of %d outputs wrong", bad, len(y))
				}
			})
		}
	}
}

// MatMulTransientTest checks that a Transient weight is read afresh: the
// same *Mat, its Data rewritten between calls (as attention refills its key
// tile for every head), must give each call's own product.
func MatMulTransientTest(t *testing.T, b kernels.Backend) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range DTypes {
		if dt.Quantized() {
			continue // transient Mats are activations, never block-quantized
		}
		w := NewMat(rng, dt, 33, 40, 8, 16)
		w.Transient = true
		x := make([]float32, 3*w.Cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for round := range 3 {
			fillMat(rng, w, 8, 16) // new values, same Mat and buffers
			y := make([]float32, 3*w.Rows)
			b.MatMul(y, x, w, 3)
			want := make([]float32, len(y))
			xr, _ := RoundX(b, x, w, 3)
			kernels.MatMulRef(want, xr, w, 3)
			abs := AbsDot(x, w, 3)
			for i := range y {
				if d := math.Abs(float64(y[i]) - float64(want[i])); !(d <= Tol*abs[i]) {
					t.Fatalf("%v round %d: y[%d] = %g, want %g: a stale copy of the weight?", dt, round, i, y[i], want[i])
				}
			}
		}
	}
}

// MatMulArgsTest checks that malformed MatMul calls panic with a
// "kernels: " message before writing anything.
func MatMulArgsTest(t *testing.T, b kernels.Backend) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := NewMat(rng, kernels.F32, 8, 16, 0, 0)
	f8 := NewMat(rng, kernels.F8E4M3, 8, 16, 4, 4)
	q8 := NewMat(rng, kernels.Q8_0, 8, 64, 0, 0)
	cases := []struct {
		name string
		y, x []float32
		w    *kernels.Mat
		n    int
	}{
		{"short x", make([]float32, 16), make([]float32, 31), w, 2},
		{"short y", make([]float32, 15), make([]float32, 32), w, 2},
		{"negative n", make([]float32, 16), make([]float32, 32), w, -1},
		{"nil w", make([]float32, 16), make([]float32, 32), nil, 2},
		{"short data", make([]float32, 16), make([]float32, 32), &kernels.Mat{DType: kernels.F32, Rows: 8, Cols: 16, Data: w.Data[:511]}, 2},
		{"short scales", make([]float32, 16), make([]float32, 32), &kernels.Mat{DType: kernels.F8E4M3, Rows: 8, Cols: 16, Data: f8.Data, Scale: f8.Scale[:7], BlockRows: 4, BlockCols: 4}, 2},
		{"zero block", make([]float32, 16), make([]float32, 32), &kernels.Mat{DType: kernels.F8E4M3, Rows: 8, Cols: 16, Data: f8.Data, Scale: f8.Scale}, 2},
		{"partial quant block", make([]float32, 16), make([]float32, 96), &kernels.Mat{DType: kernels.Q8_0, Rows: 8, Cols: 48, Data: q8.Data}, 2},
		{"short quant data", make([]float32, 16), make([]float32, 128), &kernels.Mat{DType: kernels.Q8_0, Rows: 8, Cols: 64, Data: q8.Data[:8*68-1]}, 2},
		{"unknown dtype", make([]float32, 16), make([]float32, 32), &kernels.Mat{DType: kernels.Q6K + 1, Rows: 8, Cols: 16, Data: w.Data}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.y {
				c.y[i] = yPoison
			}
			defer func() {
				r := recover()
				msg, ok := r.(string)
				if !ok || len(msg) < 9 || msg[:9] != "kernels: " {
					t.Errorf("panic %v, want a \"kernels: ...\" string", r)
				}
				for i, v := range c.y {
					if math.Float32bits(v) != math.Float32bits(yPoison) {
						t.Fatalf("y[%d] written before the panic", i)
					}
				}
			}()
			b.MatMul(c.y, c.x, c.w, c.n)
		})
	}
}

// ParallelTest checks that b.Parallel covers [0, n) exactly once with
// non-empty ranges, for n from 0 up to well past any thread count.
func ParallelTest(t *testing.T, b kernels.Backend) {
	for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64, 100, 1000, 4097, 100003} {
		hits := make([]atomic.Int32, n)
		var bad atomic.Int32
		b.Parallel(n, func(lo, hi int) {
			if lo < 0 || lo >= hi || hi > n {
				bad.Add(1)
				return
			}
			for i := lo; i < hi; i++ {
				hits[i].Add(1)
			}
		})
		if bad.Load() != 0 {
			t.Errorf("n=%d: %d calls with an empty or out-of-range [lo, hi)", n, bad.Load())
		}
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Errorf("n=%d: index %d visited %d times", n, i, h)
				break
			}
		}
	}
}

// XRounder is implemented by a backend that multiplies some weights by x
// rounded to bfloat16 (ties to even) instead of x itself, as the CPU
// backend's VDPBF16PS path does for BF16 weights. MatMulTest then takes the
// reference from the rounded x, with the same Tol: the rounding is the
// backend's declared behaviour, and the products and sums are still checked
// to float32 precision. Each rounded element is within 2⁻⁹ of its own
// magnitude, so such a result is within (2⁻⁸ + Tol)·Σₖ|x·w| of the product
// with x unrounded.
type XRounder interface {
	// RoundsXToBF16 reports whether MatMul(y, x, w, n) rounds x to
	// bfloat16.
	RoundsXToBF16(w *kernels.Mat, n int) bool
}

// RoundX returns x as b multiplies it by w over n rows: a copy rounded to
// bfloat16 and true where b is an XRounder that says so, else x and false.
func RoundX(b kernels.Backend, x []float32, w *kernels.Mat, n int) ([]float32, bool) {
	r, ok := b.(XRounder)
	if !ok || !r.RoundsXToBF16(w, n) {
		return x, false
	}
	xr := make([]float32, len(x))
	for i, v := range x {
		xr[i] = kernels.BF16ToF32(kernels.F32ToBF16(v))
	}
	return xr, true
}

// NewMat returns a rows×cols matrix of dtype dt with random weights of
// magnitude ~0.1 (F16 and F8 include subnormals; there are no NaN or Inf
// codes), and for F8E4M3 random scales in [2⁻⁸, 2⁻⁶) over blockRows×blockCols
// blocks. A quantized dtype gets random blocks: random quants, random
// float16 scales of either sign sized so that weights are ~0.1.
func NewMat(rng *rand.Rand, dt kernels.DType, rows, cols, blockRows, blockCols int) *kernels.Mat {
	m := &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, rows*dt.RowBytes(cols))}
	fillMat(rng, m, blockRows, blockCols)
	return m
}

func fillMat(rng *rand.Rand, m *kernels.Mat, blockRows, blockCols int) {
	d := m.Data
	if m.DType.Quantized() {
		fillBlocks(rng, m)
		return
	}
	for i := range m.Rows * m.Cols {
		switch m.DType {
		case kernels.F32:
			putU32(d[4*i:], math.Float32bits(float32(0.1*rng.NormFloat64())))
		case kernels.BF16:
			putU16(d[2*i:], kernels.F32ToBF16(float32(0.1*rng.NormFloat64())))
		case kernels.F16:
			// Exponent 0..17 (0 is subnormal; 15 is the bias): |w| < 8.
			putU16(d[2*i:], uint16(rng.IntN(2))<<15|uint16(rng.IntN(18))<<10|uint16(rng.IntN(1024)))
		case kernels.F8E4M3:
			b := uint8(rng.IntN(256))
			for b&0x7f == 0x7f { // NaN codes are not weights
				b = uint8(rng.IntN(256))
			}
			d[i] = b
		}
	}
	if m.DType == kernels.F8E4M3 {
		m.BlockRows, m.BlockCols = blockRows, blockCols
		m.Scale = make([]float32, ceilDiv(m.Rows, blockRows)*ceilDiv(m.Cols, blockCols))
		for i := range m.Scale {
			m.Scale[i] = float32(math.Ldexp(1+rng.Float64(), -8+rng.IntN(2)))
		}
	}
}

// quantScales says the binary exponents a quantized dtype's float16 scales
// (kernels.DType.ScaleOffsets) are drawn from.
var quantScales = map[kernels.DType]struct{ emin, em int }{
	kernels.Q8_0: {-11, -9},
	kernels.Q4_0: {-8, -6},
	kernels.Q4K:  {-13, -11},
	kernels.Q5K:  {-14, -12},
	kernels.Q6K:  {-16, -13}, // float16 subnormals below 2⁻¹⁴
}

// fillBlocks fills a quantized m with random blocks.
func fillBlocks(rng *rand.Rand, m *kernels.Mat) {
	for i := range m.Data {
		m.Data[i] = byte(rng.IntN(256))
	}
	qs := quantScales[m.DType]
	bb := m.DType.BlockBytes()
	for b := 0; b+bb <= len(m.Data); b += bb {
		for _, o := range m.DType.ScaleOffsets() {
			v := math.Ldexp(1+rng.Float64(), qs.emin+rng.IntN(qs.em-qs.emin+1))
			if rng.IntN(2) == 0 {
				v = -v
			}
			putU16(m.Data[b+o:], kernels.F32ToF16(float32(v)))
		}
	}
}

// guardedMat is a Mat whose Data and Scale sit inside guard bands.
type guardedMat struct {
	*kernels.Mat
	data []byte    // the whole buffer around Data
	off  int       // where Data starts in data
	sbuf []float32 // the whole buffer around Scale (F8 only)
}

func newGuardedMat(rng *rand.Rand, dt kernels.DType, s Shape, offset int) *guardedMat {
	size := s.Rows * dt.RowBytes(s.Cols)
	buf := make([]byte, guard+offset+size+guard)
	for i := range buf {
		buf[i] = 0xff // NaN in every dtype (read as -480 by F8 fast paths)
	}
	m := &kernels.Mat{DType: dt, Rows: s.Rows, Cols: s.Cols, Data: buf[guard+offset : guard+offset+size : guard+offset+size]}
	fillMat(rng, m, s.BlockRows, s.BlockCols)
	g := &guardedMat{Mat: m, data: buf, off: guard + offset}
	if dt == kernels.F8E4M3 {
		g.sbuf = guarded(len(m.Scale), xGuard)
		copy(g.sbuf[guard:], m.Scale)
		m.Scale = g.sbuf[guard : guard+len(m.Scale) : guard+len(m.Scale)]
	}
	return g
}

// check fails t if the backend wrote to the weights' guard bands.
func (g *guardedMat) check(t *testing.T) {
	t.Helper()
	for i, v := range g.data {
		if (i < g.off || i >= g.off+len(g.Data)) && v != 0xff {
			t.Fatalf("weight guard byte %d overwritten", i)
		}
	}
}

// guarded returns a buffer of guard+n+guard elements, the guards set to g.
func guarded(n int, g float32) []float32 {
	buf := make([]float32, guard+n+guard)
	for i := range buf {
		buf[i] = g
	}
	return buf
}

// checkGuard fails t unless buf's guard bands around its n-element body
// still hold yGuard bit for bit.
func checkGuard(t *testing.T, name string, buf []float32, n int) {
	t.Helper()
	for i, v := range buf {
		if (i < guard || i >= guard+n) && math.Float32bits(v) != math.Float32bits(yGuard) {
			t.Fatalf("%s guard element %d overwritten: %g", name, i-guard, v)
		}
	}
}

// refKey names one MatMul case; its inputs are a function of it (the seed
// is (dtype, case index)), so its reference result can be reused by every
// backend and thread count a test binary runs.
type refKey struct {
	dt      kernels.DType
	s       Shape
	i       int
	rounded bool // x rounded to bfloat16 (XRounder)
}

type refResult struct {
	want      []float32
	abs, qtol []float64
}

var refCache sync.Map // refKey → refResult

// reference returns kernels.MatMulRef's result, AbsDot and (for quantized
// weights) QuantTol for a case, computed once per test binary.
func reference(k refKey, x []float32, w *kernels.Mat) (want []float32, abs, qtol []float64) {
	if r, ok := refCache.Load(k); ok {
		r := r.(refResult)
		return r.want, r.abs, r.qtol
	}
	want = make([]float32, k.s.N*k.s.Rows)
	kernels.MatMulRef(want, x, w, k.s.N)
	abs = AbsDot(x, w, k.s.N)
	qtol = make([]float64, len(want))
	if k.dt.Quantized() {
		qtol = QuantTol(x, w, k.s.N)
	}
	refCache.Store(k, refResult{want, abs, qtol})
	return want, abs, qtol
}

// QuantTol returns the x-quantization allowance (see QuantSigmas) for every
// output (i, j) of y = x·wᵀ.
func QuantTol(x []float32, w *kernels.Mat, n int) []float64 {
	qk := 32
	if w.DType.BlockElems() == 256 {
		qk = 256
	}
	d := make([]float64, n*w.Cols/qk) // (n, cols/qk): x's block scales
	for b := range d {
		var amax float64
		for _, v := range x[b*qk : (b+1)*qk] {
			amax = max(amax, math.Abs(float64(v)))
		}
		d[b] = amax / 127
	}
	out := make([]float64, n*w.Rows)
	row := make([]float32, w.Cols)
	for j := range w.Rows {
		w.RowF32(row, j)
		for i := range n {
			var v float64
			for k, wk := range row {
				e := float64(wk) * d[(i*w.Cols+k)/qk]
				v += e * e / 12
			}
			out[i*w.Rows+j] = QuantSigmas * math.Sqrt(v)
		}
	}
	return out
}

// AbsDot returns Σₖ |x[i,k]·w[j,k]| for every output (i, j) of
// y = x·wᵀ: the scale MatMul tolerances are relative to.
func AbsDot(x []float32, w *kernels.Mat, n int) []float64 {
	out := make([]float64, n*w.Rows)
	row := make([]float32, w.Cols)
	for j := range w.Rows {
		w.RowF32(row, j)
		for i := range n {
			var s float64
			for k, v := range row {
				s += math.Abs(float64(x[i*w.Cols+k]) * float64(v))
			}
			out[i*w.Rows+j] = s
		}
	}
	return out
}

func putU16(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }
func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
func ceilDiv(a, b int) int { return (a + b - 1) / b }
