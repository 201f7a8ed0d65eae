package linattn

import "fmt"

// DefaultChunk is the chunk size of the chunkwise form when DeltaRule.Chunk
// is 0 (the value of HF's chunk_gated_delta_rule and FLA).
const DefaultChunk = 64

// DeltaRule describes one layer's gated delta rule. It holds no buffers and
// may be used by several goroutines at once (on different states).
type DeltaRule struct {
	Heads    int // value heads Hv = state heads
	KeyHeads int // q/k heads Hk; Heads%KeyHeads == 0; 0 means Heads (no GQA, KDA)
	DK, DV   int // key and value head sizes

	// PerChannel selects KDA: G holds one log-decay per key channel,
	// [T, Heads, DK]. Otherwise (GDN) G is [T, Heads].
	PerChannel bool

	// Chunk is the chunk size of Chunked; 0 means DefaultChunk.
	Chunk int

	// Parallel spreads heads over workers; nil runs serially.
	Parallel ParallelFunc
}

// Seq is one call's worth of tokens of one sequence: the inputs, where the
// outputs go and the recurrent state to continue from and update.
//
// Row t of a strided operand X starts at X[t*XStride]; a stride of 0 means
// the packed width. Within a row, head j occupies [j*D, (j+1)*D).
type Seq struct {
	T int // tokens; 0 is a no-op

	Q []float32 // [T][KeyHeads·DK] at QStride; L2-normalised and scaled by DK^-½
	K []float32 // [T][KeyHeads·DK] at KStride; L2-normalised
	V []float32 // [T][Heads·DV] at VStride

	Beta []float32 // [T, Heads], β ∈ (0, 1)
	G    []float32 // [T, Heads] (GDN) or [T, Heads, DK] (KDA); log-decay ≤ 0

	QStride, KStride, VStride int

	Out       []float32 // [T][Heads·DV] at OutStride; may not overlap the inputs
	OutStride int

	// State is S for every head, [Heads, DK, DV] float32: read as the state
	// before token 0, overwritten with the state after token T−1.
	State []float32

	// StatesAfter, if not nil (Recurrent only), has T entries; every non-nil
	// StatesAfter[t] ([Heads, DK, DV]) receives the state after token t.
	// Speculative verification uses it to keep one state per position.
	StatesAfter [][]float32
}

// Forward runs the chunkwise form for prompts and the recurrent form for a
// few tokens (decode and short verification windows), whichever is faster.
func (d *DeltaRule) Forward(s *Seq) {
	if s.T <= recurrentMaxT {
		d.Recurrent(s)
		return
	}
	d.Chunked(s)
}

// recurrentMaxT is the longest call Forward runs token by token.
const recurrentMaxT = 8

func (d *DeltaRule) keyHeads() int {
	if d.KeyHeads == 0 {
		return d.Heads
	}
	return d.KeyHeads
}

func (d *DeltaRule) chunk() int {
	if d.Chunk == 0 {
		return DefaultChunk
	}
	return d.Chunk
}

// StateLen is the number of float32s of one layer's state, Heads·DK·DV.
func (d *DeltaRule) StateLen() int { return d.Heads * d.DK * d.DV }

// strides returns the effective row strides of q, k, v and out.
func (d *DeltaRule) strides(s *Seq) (qs, ks, vs, os int) {
	kw, vw := d.keyHeads()*d.DK, d.Heads*d.DV
	qs, ks, vs, os = s.QStride, s.KStride, s.VStride, s.OutStride
	if qs == 0 {
		qs = kw
	}
	if ks == 0 {
		ks = kw
	}
	if vs == 0 {
		vs = vw
	}
	if os == 0 {
		os = vw
	}
	return
}

// check panics with a description of the first inconsistency between d and s.
func (d *DeltaRule) check(s *Seq) {
	hk := d.keyHeads()
	switch {
	case d.Heads <= 0 || d.DK <= 0 || d.DV <= 0 || hk <= 0:
		panic(fmt.Sprintf("linattn: bad DeltaRule dims %+v", *d))
	case d.Heads%hk != 0:
		panic(fmt.Sprintf("linattn: Heads %d not a multiple of KeyHeads %d", d.Heads, hk))
	case d.chunk() <= 0:
		panic(fmt.Sprintf("linattn: bad chunk size %d", d.Chunk))
	case s.T < 0:
		panic("linattn: negative T")
	}
	if s.T == 0 {
		return
	}
	qs, ks, vs, os := d.strides(s)
	kw, vw := hk*d.DK, d.Heads*d.DV
	need := func(name string, buf []float32, stride, width int) {
		if stride < width {
			panic(fmt.Sprintf("linattn: %s stride %d < row width %d", name, stride, width))
		}
		if n := (s.T-1)*stride + width; len(buf) < n {
			panic(fmt.Sprintf("linattn: %s has %d values, need %d", name, len(buf), n))
		}
	}
	need("Q", s.Q, qs, kw)
	need("K", s.K, ks, kw)
	need("V", s.V, vs, vw)
	need("Out", s.Out, os, vw)
	if len(s.Beta) < s.T*d.Heads {
		panic(fmt.Sprintf("linattn: Beta has %d values, need %d", len(s.Beta), s.T*d.Heads))
	}
	ng := s.T * d.Heads
	if d.PerChannel {
		ng *= d.DK
	}
	if len(s.G) < ng {
		panic(fmt.Sprintf("linattn: G has %d values, need %d", len(s.G), ng))
	}
	if len(s.State) < d.StateLen() {
		panic(fmt.Sprintf("linattn: State has %d values, need %d", len(s.State), d.StateLen()))
	}
	if s.StatesAfter != nil {
		if len(s.StatesAfter) < s.T {
			panic(fmt.Sprintf("linattn: StatesAfter has %d entries, need %d", len(s.StatesAfter), s.T))
		}
		for t, st := range s.StatesAfter[:s.T] {
			if st != nil && len(st) < d.StateLen() {
				panic(fmt.Sprintf("linattn: StatesAfter[%d] has %d values, need %d", t, len(st), d.StateLen()))
			}
		}
	}
}
