package cpu

import (
	"encoding/binary"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Q8_0 and Q4_0 weights repacked into groups of eight rows ("x8", as
// llama.cpp's CPU_REPACK q4_0_8x8 does for Q4_0): per group of rows 8g ..
// 8g+7 and 32-column block b, in that order (group after group, a group's
// blocks one after the other),
//
//	16 bytes: the eight rows' float16 scales
//	Q8_0: 8 chunks c of 32 bytes: row r's quants 4c .. 4c+3 at bytes 4r .. 4r+3
//	Q4_0: 4 vectors v of 32 bytes: row r's nibble bytes 4v .. 4v+3 at 4r .. 4r+3
//	      (low nibbles: columns 4v .. 4v+3; high: 16+4v .. 16+4v+3)
//
// so a group block is as long as the eight stored blocks (272 and 144
// bytes) and holds the same values. Against x's four bytes broadcast to
// every lane, one vector holds a column chunk of all eight rows: the
// kernels (kernels/_generate/qx8.go) keep each row's sum in its own lane
// and write a group's eight results with one store.
//
// Q4_0 and Q8_0 weights are repacked once per matrix, by PrepareWeights
// after the load (prepare.go) or else on the matrix's first MatMul, and
// kept (x8Cache: as much memory again as the stored weights, which
// then are no longer read by MatMul): the layout serves decode too, where
// llama.cpp's repacked Q4_0 read faster than the stored rows, and a batch
// of 8 no longer packs its weights on every call (Q8_0 on a Zen 5,
// BenchmarkQPaths and BenchmarkQDecode: 1.9× less CPU time at n = 8; at
// n = 1 1.6× in cache, 8 % from memory). A mixture of
// experts' Q8_0 experts (most of such a model's bytes) are not kept, to
// bound the memory: they, and Q4_K, are packed per task, a block of rows
// at a time into the worker's scratch, when there are x8MinRows or more x
// rows to amortize it (prefill and batches).

// x8MinRows is the fewest x rows for which a task packs its weight rows
// (persistently packed weights take the x8 kernels at any n).
const x8MinRows = 8

// x8Block is about how many bytes of packed weight rows a task works on at
// a time: every x row of the task then goes over them while they sit in
// L2 (512 KiB a core on Zen 3).
const x8Block = 128 << 10

// An x8Func sets y[r·ldy + 8g + l] for r < R x rows, g < groups, l < 8 to
// the dot product of row 8g + l of the packed weights w (k columns, a
// multiple of 32) with x row r quantized in blocks of 32 (q[r·ldq:], its
// (d, s) pairs at ds[2·r·ldq/32:]; its Σq per 16 columns at bs[r·ldq/16:],
// for Q4_K).
type x8Func func(y []float32, ldy int, q []int8, ds []float32, bs []int16, ldq int, w []byte, k, groups int)

// x8Set is one dtype's x8 kernels: one and four x rows, over groups of
// rows rows (8; 16 for the x16 kernels).
type x8Set struct {
	r1, r4 x8Func
	rows   int
}

// genericX8 are the Go twins of the x8 kernels, indexed by kernels.DType.
var genericX8 = [...]x8Set{
	kernels.Q8_0: {r1: x8Go(kernels.Q8_0, 1, 8), r4: x8Go(kernels.Q8_0, 4, 8), rows: 8},
	kernels.Q4_0: {r1: x8Go(kernels.Q4_0, 1, 8), r4: x8Go(kernels.Q4_0, 4, 8), rows: 8},
	kernels.Q4K:  {r1: x8Go(kernels.Q4K, 1, 8), r4: x8Go(kernels.Q4K, 4, 8), rows: 8},
}

// genericX16 are the Go twins of the x16 kernels (Q8_0 and Q4_0).
var genericX16 = [...]x8Set{
	kernels.Q8_0: {r1: x8Go(kernels.Q8_0, 1, 16), r4: x8Go(kernels.Q8_0, 4, 16), rows: 16},
	kernels.Q4_0: {r1: x8Go(kernels.Q4_0, 1, 16), r4: x8Go(kernels.Q4_0, 4, 16), rows: 16},
}

// x8Off turns the x8 path off (FERRITE_CPU_X8=0 in the environment, or
// the benchmarks that compare), so one build can run both.
var x8Off atomic.Bool

func init() { x8Off.Store(os.Getenv("FERRITE_CPU_X8") == "0") }

// forceGenericX8 makes x8For return the Go twins on any CPU
// (ForceGenericX8), so the x8 driver can be tested without AVX2.
var forceGenericX8 atomic.Bool

// x8For returns the x8 kernels for quantized dtype d, or nil where there
// are none: only Q8_0, Q4_0 and Q4_K have them, and only on AVX2 (with or
// without VNNI), unless forced.
func x8For(d kernels.DType) *x8Set {
	if d != kernels.Q8_0 && d != kernels.Q4_0 && d != kernels.Q4K || x8Off.Load() {
		return nil
	}
	if forceGenericX8.Load() {
		return &genericX8[d]
	}
	return asmX8(d)
}

// x8GroupBytes is the bytes of one group block (G rows, one block of d's
// columns: 32, or 256 for Q4_K, whose scales are widened).
func x8GroupBytes(d kernels.DType, G int) int {
	if d == kernels.Q4K {
		return x8Q4KBytes
	}
	return G * d.RowBytes(32)
}

// x8Q4KBytes is a packed Q4_K group block: d and dmin (2·16 bytes), the
// scales and the mins as int16 pairs (2·256), the nibbles (1024).
const x8Q4KBytes = 32 + 256 + 256 + 1024

// x8RowBytes is the packed bytes of a group of G rows of k columns.
func x8RowBytes(d kernels.DType, k, G int) int { return k / d.BlockElems() * x8GroupBytes(d, G) }

// packX8 writes groups groups of G rows (8, or 16: Q8_0 and Q4_0) of w
// (rows of k columns of dtype d, from w's first byte) to dst in the x8
// (x16) layout: with the AVX2 packer (kernels/_generate/qx8.go) where the
// CPU has it, else packX8Go. An x16 group block is the two x8 group blocks
// of its rows 0-7 and 8-15 interleaved: their scales (16 bytes each), then
// their 32-byte vectors in turn, so that a zmm register holds a vector of
// all sixteen rows, row l in dword lane l.
func packX8(dst, w []byte, d kernels.DType, k, groups, G int) {
	if groups > 0 && k > 0 && packX8Asm(dst, w, d, k, groups, G) {
		return
	}
	packX8Go(dst, w, d, k, groups, G)
}

// packX8Go is packX8 in Go.
func packX8Go(dst, w []byte, d kernels.DType, k, groups, G int) {
	be := d.BlockElems()
	rb, nb, gb := d.RowBytes(k), k/be, x8GroupBytes(d, G)
	sb := d.RowBytes(be) // stored bytes per block: 34 (Q8_0), 18 (Q4_0), 144 (Q4_K)
	chunks := (sb - 2) / 4
	dst = dst[:groups*nb*gb]
	le := binary.LittleEndian
	for g := range groups {
		gw := w[G*g*rb : G*(g+1)*rb]
		for b := range nb {
			out := dst[(g*nb+b)*gb : (g*nb+b+1)*gb]
			for r := range G {
				src := gw[r*rb+b*sb : r*rb+(b+1)*sb]
				le.PutUint16(out[2*r:], le.Uint16(src))
				switch d {
				case kernels.Q4K:
					le.PutUint16(out[16+2*r:], le.Uint16(src[2:]))
					sc, mn := scaleMinK4x8(src[4:16])
					for j := range 8 {
						le.PutUint32(out[32+32*j+4*r:], uint32(sc>>(8*j)&0xff)*0x10001)
						le.PutUint32(out[288+32*j+4*r:], uint32(mn>>(8*j)&0xff)*0x10001)
					}
					for c := range 32 { // pair c/8 of sub-blocks, vector c%8
						le.PutUint32(out[544+32*c+4*r:], le.Uint32(src[16+4*c:]))
					}
				default:
					for c := range chunks {
						le.PutUint32(out[2*G+4*G*c+4*r:], le.Uint32(src[2+4*c:]))
					}
				}
			}
		}
	}
}

// scaleMinK4x8 returns a Q4_K block's eight 6-bit scales and mins
// (kernels.ScaleMinK4 of j in byte j) from its twelve scale bytes.
func scaleMinK4x8(s []byte) (sc, mn uint64) {
	le := binary.LittleEndian
	a0, a1, a2 := le.Uint32(s), le.Uint32(s[4:]), le.Uint32(s[8:])
	sc = uint64(a0&0x3f3f3f3f) | uint64(a2&0x0f0f0f0f|(a0>>6&0x03030303)<<4)<<32
	mn = uint64(a1&0x3f3f3f3f) | uint64(a2>>4&0x0f0f0f0f|(a1>>6&0x03030303)<<4)<<32
	return sc, mn
}

// x8Go is the Go twin of the x8 (G = 8) or x16 (G = 16, Q8_0 and Q4_0)
// kernel of dtype d for R x rows: the same integer sums, and per block, in
// float32, acc += float32(Σ)·(dw·d) (Q8_0), acc += dw·(float32(Σ)·d − 8·s)
// (Q4_0), or acc += float32(Σⱼ scⱼ·Σ)·(dw·d) − float32(Σⱼ mⱼ·Σq)·(dmin·d)
// (Q4_K).
func x8Go(d kernels.DType, R, G int) x8Func {
	gb, be := x8GroupBytes(d, G), d.BlockElems()
	return func(y []float32, ldy int, q []int8, ds []float32, bs []int16, ldq int, w []byte, k, groups int) {
		nb := k / be
		for g := range groups {
			for r := range R {
				xq, xd := q[r*ldq:], ds[2*r*ldq/32:]
				var acc [16]float32
				for b := range nb {
					blk := w[(g*nb+b)*gb : (g*nb+b+1)*gb]
					xb := xq[be*b : be*(b+1)]
					dx := xd[2*b*be/32]
					for l := range G {
						dw := f16(blk[2*l:])
						var sum int32
						switch d {
						case kernels.Q8_0:
							for c := range 8 {
								for i := range 4 {
									sum += int32(int8(blk[2*G+4*G*c+4*l+i])) * int32(xb[4*c+i])
								}
							}
							acc[l] += float32(sum) * (dw * dx)
						case kernels.Q4_0:
							for v := range 4 {
								for i := range 4 {
									n := blk[2*G+4*G*v+4*l+i]
									sum += int32(n&0xf)*int32(xb[4*v+i]) + int32(n>>4)*int32(xb[16+4*v+i])
								}
							}
							acc[l] += dw * (float32(sum)*dx - 8*xd[2*b+1])
						case kernels.Q4K:
							xs := bs[r*ldq/16+16*b:]
							var msum int32
							for j := range 8 {
								sc := int32(blk[32+32*j+4*l])
								m := int32(blk[288+32*j+4*l])
								var sj int32
								for v := range 8 {
									for i := range 4 {
										n := blk[544+256*(j/2)+32*v+4*l+i] >> (4 * uint(j%2)) & 0xf
										sj += int32(n) * int32(xb[32*j+4*v+i])
									}
								}
								sum += sc * sj
								msum += m * (int32(xs[2*j]) + int32(xs[2*j+1]))
							}
							acc[l] += float32(sum) * (dw * dx)
							acc[l] -= float32(msum) * (f16(blk[16+2*l:]) * dx)
						}
					}
				}
				copy(y[r*ldy+G*g:r*ldy+G*g+G], acc[:G])
			}
		}
	}
}

// x8Cache holds the persistently packed weights (Q4_0), per matrix.
type x8Cache struct{ weightCache[x8Packed] }

// x8Packed is one matrix's packed whole groups.
type x8Packed struct {
	data []byte
	rows int // rows per group of data's layout
}

// x8Persistent reports whether MatMul keeps w repacked: Q4_0 weights, and
// Q8_0 ones that are not an expert's, not Transient, with x8 kernels on
// this CPU, whole 32-column blocks and at least eight rows.
func x8Persistent(w *kernels.Mat, expert bool) bool {
	if !(w.DType == kernels.Q4_0 || w.DType == kernels.Q8_0 && !expert) || w.Transient || w.Cols <= 0 || w.Cols%32 != 0 {
		return false
	}
	// At least eight rows, not a whole group of sixteen: the x16 kernels
	// take 8-15 rows as a padded group, as the x8 kernels take the rows
	// past the last whole group, so that a row's bits do not depend on the
	// rows stacked with it in one matrix.
	return x8For(w.DType) != nil && w.Rows >= 8
}

// packed returns w's whole groups of eight rows in the x8 layout, packing
// them on first use (over the workers when pack is not nil), or nil when
// w is not kept packed (x8Persistent; expert: w is a routed expert's).
func (c *x8Cache) packed(w *kernels.Mat, pack func(groups int, fn func(lo, hi int)), expert bool) []byte {
	if !x8Persistent(w, expert) {
		return nil
	}
	e := c.get(w, func() (x8Packed, int64) {
		G := x8For(w.DType).rows
		groups, rb := w.Rows/G, w.DType.RowBytes(w.Cols)
		gsz := x8RowBytes(w.DType, w.Cols, G)
		p := x8Packed{data: prefaulted(groups * gsz), rows: G}
		pack(groups, func(lo, hi int) {
			packX8(p.data[lo*gsz:hi*gsz], w.Data[G*lo*rb:G*hi*rb], w.DType, w.Cols, hi-lo, G)
		})
		return p, int64(len(p.data))
	})
	if x8For(w.DType).rows != e.rows { // the kernels changed (tests switching CPU features)
		return nil
	}
	return e.data
}

// x8task is qtask on the x8 path: output rows [r0, r1) (r0 a multiple of
// G, the kernels' rows per group: 8, or 16) for x rows [i0, i1). Whole
// groups of G rows run through the x8 kernels, from the persistently
// packed weights or packed here a block at a time into scratch; the
// matrix's last rows, fewer than G, are packed as a group padded with zero
// rows into scratch, their results going through scratch too. So every
// row takes the same kernel, and its result does not depend on how the
// rows are grouped.
func (m *matmul) x8task(r0, r1, i0, i1 int, scratch *[]float32) {
	w, G := m.w, m.x8.rows
	cols, ldy := w.Cols, m.ldy
	g1 := r0 + (r1-r0)/G*G
	rb := w.DType.RowBytes(cols)
	gsz := x8RowBytes(w.DType, cols, G)
	step := max(G, x8Block/max(rb, 1)/G*G)
	for s0 := r0; s0 < g1; s0 += step {
		s1 := min(g1, s0+step)
		groups := (s1 - s0) / G
		var panel []byte
		if m.pk != nil {
			panel = m.pk[s0/G*gsz : s1/G*gsz]
		} else {
			panel = scratchBytes(scratch, groups*gsz)
			packX8(panel, w.Data[s0*rb:s1*rb], w.DType, cols, groups, G)
		}
		m.x8rows(m.y[s0:], ldy, panel, groups, i0, i1, 0)
	}
	if g1 == r1 {
		return
	}
	nx := i1 - i0
	buf := scratchBytes(scratch, 4*G*nx+G*rb+gsz)
	yt := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), G*nx)
	rowsT, panel := buf[4*G*nx:4*G*nx+G*rb], buf[4*G*nx+G*rb:]
	clear(rowsT[copy(rowsT, w.Data[g1*rb:r1*rb]):])
	packX8(panel, rowsT, w.DType, cols, 1, G)
	m.x8rows(yt, G, panel, 1, i0, i1, i0)
	for i := range nx {
		copy(m.y[(i0+i)*ldy+g1:(i0+i)*ldy+r1], yt[G*i:G*i+r1-g1])
	}
}

// x8rows runs the x8 kernels over groups packed groups of rows (panel)
// for x rows [i0, i1), four at a time, then one: x row i's results go to
// y[(i − y0)·ldy:].
func (m *matmul) x8rows(y []float32, ldy int, panel []byte, groups, i0, i1, y0 int) {
	cols := m.w.Cols
	nb, span := cols/32, m.x8.rows*groups
	q, ds, bs, x8 := m.qx.q, m.qx.ds, m.qx.bs, m.x8
	for i := i0; i < i1; {
		yi := (i - y0) * ldy
		if i+4 <= i1 {
			x8.r4(y[yi:yi+3*ldy+span], ldy, q[i*cols:(i+4)*cols], ds[2*i*nb:2*(i+4)*nb], bs[2*i*nb:2*(i+4)*nb], cols, panel, cols, groups)
			i += 4
			continue
		}
		x8.r1(y[yi:yi+span], ldy, q[i*cols:(i+1)*cols], ds[2*i*nb:2*(i+1)*nb], bs[2*i*nb:2*(i+1)*nb], cols, panel, cols, groups)
		i++
	}
}

// scratchBytes returns n bytes of *s's storage, grown to hold them.
func scratchBytes(s *[]float32, n int) []byte {
	if cap(*s) < (n+3)/4 {
		*s = make([]float32, (n+3)/4)
	}
	f := (*s)[:cap(*s)]
	return f32Bytes(f)[:n]
}
