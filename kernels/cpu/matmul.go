package cpu

import "github.com/ferrite-llm/ferrite/kernels"

const (
	// batchChunk is the most x rows one task multiplies; larger batches are
	// split so prefill spreads over the workers even for narrow weights.
	batchChunk = 64
	// weightBlock is how many bytes of weight rows a task keeps hot in L1
	// while it runs all its x rows past them (n > 1). Measured on Zen 5:
	// 24-48 KiB run prefill twice as fast as 192 KiB (L2).
	weightBlock = 32 << 10
	// minTaskMACs keeps tasks big enough to be worth a wake-up.
	minTaskMACs = 1 << 15
	// maxTaskBytes caps the weights one task of a single batch chunk
	// streams (about 0.15 ms at a core's 25-30 GB/s).
	maxTaskBytes = 4 << 20
)

// matmul is one MatMul call cut into tasks: a grid of nr row chunks of rc
// output rows times nb batch chunks of bc x rows.
type matmul struct {
	y, x   []float32 // (n, w.Rows) with row stride ldy, (n, w.Cols)
	ldy    int
	w      *kernels.Mat
	wd     []byte // the weight bytes the bf16 path reads: w.Data, or its resident copy
	n      int
	tiles  *tileSet
	esz    int          // bytes per weight element
	qt     *qtileSet    // quantized w only: its tiles,
	qx     *qrows       // and x quantized to int8
	x8     *x8Set       // Q8_0 and Q4_0 on the x8 path (x8.go): its kernels,
	pk     []byte       // and the persistently packed weights (nil: packed per task)
	bt     *bf16TileSet // the bf16 path only (bf16.go): its tiles,
	gemv   gemvFunc     // the one-x-row kernel for wd,
	xb     *bf16Rows    // and x rounded to bfloat16
	ak     *amxKernels  // the AMX path only (amx.go): its kernels,
	xa     *amxX        // and x rounded and packed
	rc, bc int          // rows per row chunk (a multiple of 4), x rows per batch chunk
	nr     int          // number of row chunks
	tasks  int
}

// xbufs are the converted x rows a MatMul may need.
type xbufs struct {
	q qrows    // quantized to int8, for a quantized w
	b bf16Rows // rounded to bfloat16, for the bf16 path
	a amxX     // rounded and packed, for AMX
}

// init plans y = x·wᵀ for n rows on workers workers; for a quantized w, or
// on the bf16 paths (allowed with bf16), xs is sized to receive x converted
// (which the caller does before the tasks run, with m.convertX). pk is w
// kept packed for the x8 kernels (x8Cache), or nil.
func (m *matmul) init(y, x []float32, w *kernels.Mat, n, workers int, xs *xbufs, bf16 bool, pk []byte) {
	*m = matmul{y: y, x: x, w: w, wd: w.Data, n: n, ldy: w.Rows}
	gran := 4 // output rows per row chunk: a multiple of the tiles' rows
	m.bc = min(n, batchChunk)
	switch path := bf16Path(w, n, bf16); {
	case path == pathAMX:
		m.ak, m.xa = amxKernelsFor(), &xs.a
		m.xa.resize(n, w.Cols)
		gran = amxRows
		if w.DType.Quantized() {
			m.bc = n // dequantize each weight block once for all x rows
		}
	case w.DType.Quantized():
		m.qt, m.qx = qtilesFor(w.DType), &xs.q
		m.qx.resize(n, w.Cols, xGroup(w.DType))
		if x8 := x8For(w.DType); x8 != nil && w.Cols%32 == 0 && w.Rows >= 8 && (pk != nil || n >= x8MinRows) {
			// Every task takes all x rows past each block of its
			// weight rows (packed once, if not kept packed).
			m.x8, m.pk, m.bc, gran = x8, pk, n, x8.rows
		}
	case path == pathBF16:
		m.bt, m.xb = bf16TilesFor(), &xs.b
		m.gemv = m.bt.gemv
		m.xb.resize(n, w.Cols)
	default:
		m.tiles, m.esz = tilesFor(w.DType), w.DType.Size()
	}
	nb := ceilDiv(n, m.bc)
	// Aim for 4 tasks per worker so uneven cores even out, but no smaller
	// than minTaskMACs.
	rowTasks := max(1, ceilDiv(4*workers, nb))
	if nb == 1 {
		// A large matrix (a decode step's LM head: 311 MB in BF16 for
		// Qwen3-0.6B) in tasks of at most maxTaskBytes of weights: the
		// last task of a call leaves the other workers waiting, and an
		// eighth of such a matrix streams for milliseconds.
		rowTasks = max(rowTasks, ceilDiv(w.Rows*w.DType.RowBytes(w.Cols), maxTaskBytes))
	}
	if workers == 1 {
		rowTasks = 1
	}
	m.rc = roundUp(ceilDiv(w.Rows, rowTasks), gran)
	m.rc = max(m.rc, roundUp(ceilDiv(minTaskMACs, m.bc*max(w.Cols, 1)), gran))
	m.nr = ceilDiv(w.Rows, m.rc)
	m.tasks = m.nr * nb
}

// task runs task t: output rows [r0, r1) for x rows [i0, i1).
func (m *matmul) task(t int, scratch *[]float32) {
	r0 := (t % m.nr) * m.rc
	i0 := (t / m.nr) * m.bc
	r1 := min(m.w.Rows, r0+m.rc)
	i1 := min(m.n, i0+m.bc)

	if m.x8 != nil {
		m.x8task(r0, r1, i0, i1, scratch)
		return
	}
	if m.qt != nil {
		m.qtask(r0, r1, i0, i1)
		return
	}
	if m.bt != nil {
		m.btask(r0, r1, i0, i1)
		return
	}
	if m.ak != nil {
		m.atask(r0, r1, i0, i1, scratch)
		return
	}
	cols := m.w.Cols
	step := r1 - r0
	if i1-i0 > 1 {
		// Cache blocking: a block of weight rows stays in L1 while every
		// x row of the task goes past it, so each weight byte comes from
		// memory once per task.
		step = max(4, weightBlock/max(cols*m.esz, 1)&^3)
	}
	x, ldx := m.x[i0*cols:], cols
	scaled := -1 // the F8 row block x is scaled for
	for s0 := r0; s0 < r1; {
		s1 := min(r1, s0+step)
		if m.w.DType == kernels.F8E4M3 {
			// Fold the block scales of this row block into x, so the
			// tiles see unscaled e4m3 weights.
			rb := s0 / m.w.BlockRows
			s1 = min(s1, (rb+1)*m.w.BlockRows)
			if rb != scaled {
				x, scaled = m.scaleX(scratch, i0, i1, rb), rb
			}
		}
		m.block(s0, s1, i0, i1, x, ldx)
		s0 = s1
	}
}

// block sets y[i, j] for i in [i0, i1), j in [s0, s1); x holds the x rows
// from i0 on with stride ldx. x rows go four at a time where the CPU has a
// 4-row tile, then two, then one.
func (m *matmul) block(s0, s1, i0, i1 int, x []float32, ldx int) {
	ldy, cols, esz, t := m.ldy, m.w.Cols, m.esz, m.tiles
	data := m.w.Data
	for i := i0; i < i1; {
		xi := x[(i-i0)*ldx:]
		yi := m.y[i*ldy:]
		j := s0
		switch {
		case t.r4c3 != nil && i+4 <= i1:
			for ; j+3 <= s1; j += 3 {
				t.r4c3(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			for ; j < s1; j++ {
				t.r4c1(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			i += 4
		case t.r4c4 != nil && i+4 <= i1:
			for ; j+4 <= s1; j += 4 {
				t.r4c4(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			for ; j < s1; j++ {
				t.r2c1(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
				t.r2c1(yi[2*ldy+j:], ldy, xi[2*ldx:], ldx, data[j*cols*esz:], cols, cols)
			}
			i += 4
		case i+2 <= i1:
			for ; j+4 <= s1; j += 4 {
				t.r2c4(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			for ; j < s1; j++ {
				t.r2c1(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			i += 2
		default:
			for ; j < s1; j++ {
				t.r1c1(yi[j:], ldy, xi, ldx, data[j*cols*esz:], cols, cols)
			}
			i++
		}
	}
}

// qtask is task for a quantized w: output rows [r0, r1) for x rows [i0, i1),
// weight rows blocked in L1 as in task. Where the dtype has gemv kernels
// (and the rows are whole 256-column groups), each takes the block of
// weight rows in one call, four x rows at a time, then one; else the
// tiles go row by row.
func (m *matmul) qtask(r0, r1, i0, i1 int) {
	cols, ldy := m.w.Cols, m.ldy
	rb := m.w.DType.RowBytes(cols)
	step := r1 - r0
	if i1-i0 > 1 {
		step = max(1, weightBlock/max(rb, 1))
	}
	q, ds, bs, t := m.qx.q, m.qx.ds, m.qx.bs, m.qt
	nb := cols / qk
	gemv := t.gemv != nil && cols > 0 && cols%256 == 0
	for s0 := r0; s0 < r1; s0 += step {
		s1 := min(r1, s0+step)
		w := m.w.Data[s0*rb : s1*rb]
		for i := i0; i < i1; {
			r := 1
			if (t.r4 != nil || gemv && t.gemv4 != nil) && i+4 <= i1 {
				r = 4
			}
			switch {
			case gemv && r == 4 && t.gemv4 != nil:
				t.gemv4(m.y[i*ldy+s0:(i+3)*ldy+s1], ldy, q[i*cols:(i+4)*cols], ds[2*i*nb:2*(i+4)*nb], bs[2*i*nb:2*(i+4)*nb],
					cols, w, cols, s1-s0, f16Table())
			case gemv && r == 1:
				t.gemv(m.y[i*ldy+s0:i*ldy+s1], ldy, q[i*cols:(i+1)*cols], ds[2*i*nb:2*(i+1)*nb], bs[2*i*nb:2*(i+1)*nb],
					cols, w, cols, s1-s0, f16Table())
			default:
				tile := t.r1
				if r == 4 {
					tile = t.r4
				}
				for j := s0; j < s1; j++ {
					tile(m.y[i*ldy+j:], ldy, q[i*cols:], ds[2*i*nb:], cols, m.w.Data[j*rb:(j+1)*rb], cols)
				}
			}
			i += r
		}
	}
}

// convertUnits is how many units (x rows; 16-row groups for AMX) x is
// converted in before the tasks run, 0 for none.
func (m *matmul) convertUnits() int {
	switch {
	case m.qx != nil, m.xb != nil:
		return m.n
	case m.xa != nil:
		return m.xa.groups()
	}
	return 0
}

// convertX converts units [lo, hi) of x for the tiles: rows quantized to
// int8 for a quantized w, rows rounded to bfloat16 on the bf16 path, groups
// rounded and packed for AMX.
func (m *matmul) convertX(lo, hi int) {
	switch {
	case m.qx != nil:
		m.qx.quantizeRows(m.x, m.w.Cols, lo, hi)
	case m.xb != nil:
		m.xb.roundRows(m.x, m.w.Cols, lo, hi)
	case m.xa != nil:
		m.xa.packGroups(m.ak, m.x, m.w.Cols, lo, hi)
	}
}

// scaleX writes x rows [i0, i1), each column multiplied by the scale of
// its column block in row block rb, to *scratch and returns them.
func (m *matmul) scaleX(scratch *[]float32, i0, i1, rb int) []float32 {
	w := m.w
	cols := w.Cols
	nx := i1 - i0
	if cap(*scratch) < nx*cols {
		*scratch = make([]float32, nx*cols)
	}
	dst := (*scratch)[:nx*cols]
	src := m.x[i0*cols : i1*cols]
	sCols := ceilDiv(cols, w.BlockCols)
	srow := w.Scale[rb*sCols : (rb+1)*sCols]
	for i := range nx {
		d, s := dst[i*cols:(i+1)*cols], src[i*cols:(i+1)*cols]
		for cb, sc := range srow {
			lo, hi := cb*w.BlockCols, min(cols, (cb+1)*w.BlockCols)
			scale(d[lo:hi], s[lo:hi], sc)
		}
	}
	return dst
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
func roundUp(a, g int) int { return ceilDiv(a, g) * g }
