//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"sync"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Multi-head latent attention and DSA sparse attention on the GPU
// (kernels.MLAOps, kernels.SparseOps), the kernels of src/ops_mla.cu. Like
// the rest of the op set, every op checks shapes on the host and queues a
// closure of launches whose sizes come from host values only (row counts,
// the block table's width, the selection width), so a step never waits and
// CUDA graph capture keeps working.

var (
	_ kernels.MLAOps    = (*Backend)(nil)
	_ kernels.SparseOps = (*Backend)(nil)
)

func init() {
	kernelNames = append(kernelNames,
		"ferrite_mla_store_latent", "ferrite_dsa_store_key", "ferrite_mla_uk_t", "ferrite_mla_proj", "ferrite_mla_proj_q_1", "ferrite_mla_proj_q_8", "ferrite_mla_combine",
		"ferrite_mla_attn_f32_1", "ferrite_mla_attn_f32_2", "ferrite_mla_attn_f32_4",
		"ferrite_mla_attn_bf16_1", "ferrite_mla_attn_bf16_2", "ferrite_mla_attn_bf16_4",
		"ferrite_dsa_scores_f32", "ferrite_dsa_scores_bf16", "ferrite_topk",
		"ferrite_mla_tc_1", "ferrite_mla_tc_2", "ferrite_mla_tc_3", "ferrite_mla_tc_4", "ferrite_mla_merge", "ferrite_mla_proj_tc_8", "ferrite_mla_proj_tc_32")
	bigSmemKernels = append(bigSmemKernels, append(mlaTCKernels[:], "ferrite_mla_proj_tc_8", "ferrite_mla_proj_tc_32")...)
	// The decode chain of an MLA layer starts each kernel with
	// FERRITE_PDL_WAIT() (TestPDLKernelsWait), so each may be launched
	// while the one before drains.
	for _, k := range append([]string{"ferrite_mla_store_latent", "ferrite_rope", "ferrite_mla_proj", "ferrite_mla_proj_q_1", "ferrite_mla_proj_q_8", "ferrite_mla_proj_tc_8", "ferrite_mla_proj_tc_32", "ferrite_mla_merge"}, mlaTCKernels[:]...) {
		pdlKernels[k] = true
	}
}

// kvbOn is false when FERRITE_CUDA_KVB=0: AttentionMLA then uploads a
// GGUF's kv_b_proj as the float32 matrix rebuilt from its halves, as before
// kvbWeights (for A/B comparisons).
var kvbOn = os.Getenv("FERRITE_CUDA_KVB") != "0"

// mlaTCKernels[nt−1] is the tensor-core latent attention (src/tensor_mla.cu)
// for groups of up to 8·nt heads.
var mlaTCKernels = [4]string{"ferrite_mla_tc_1", "ferrite_mla_tc_2", "ferrite_mla_tc_3", "ferrite_mla_tc_4"}

// mlaTCEnabled is false when FERRITE_MLA_TC=0: AttentionMLA then keeps to
// the CUDA-core kernels (ferrite_mla_attn_*), for A/B comparisons.
var mlaTCEnabled = os.Getenv("FERRITE_MLA_TC") != "0"

// The shape src/tensor_mla.cu takes: a BF16 cache of 512 latent and 64
// rope dims, key tiles of 32, up to 32 heads a block.
const (
	mlaTCLatent = 512
	mlaTCRope   = 64
	mlaTCKeys   = 32
	mlaTCHeads  = 32
)

// mlaProjSmem is ferrite_mla_proj_tc_*'s shared memory for a weight k
// values wide and 8·nq query rows a block: the rows in three bf16 terms,
// and three k-quarters' partial sums.
func mlaProjSmem(k, nq int) int { return 3*k*8*nq*2 + 3*2*nq*32*4*4 }

// mlaTCSmem is TcSmem<nt>::bytes of src/tensor_mla.cu: the query's three
// bf16 terms as B fragments, two key tiles, the partial scores, the
// probabilities' two terms, and the per-head scalars.
func mlaTCSmem(nt int) int {
	const kw, ks = mlaTCLatent + mlaTCRope, (mlaTCLatent + mlaTCRope) / 16
	return 3*nt*ks*32*8 + 2*mlaTCKeys*(kw+8)*2 + 4*mlaTCKeys*(8*nt+1)*4 + 2*2*nt*32*8 + (3*32+2*mlaTCKeys)*4
}

// Tiling of src/ops_mla.cu.
const (
	mlaRows    = 8        // query rows and output rows per projection block
	mlaGroup   = 16       // query heads per attention block, at most
	mlaSplit   = 32       // keys per attention split, at least (one tile)
	mlaTile    = 32       // keys an attention block scores at a time
	mlaMaxKL   = 1024     // kv_lora_rank the attention kernels take (256·DPT, DPT ≤ 4)
	mlaSmem    = 44 << 10 // dynamic shared memory an attention block may take
	topKThread = 512
)

// mlaAttnKernels[bf16][i] handles kv_lora_rank up to 256·2^i.
var mlaAttnKernels = [2][3]string{
	{"ferrite_mla_attn_f32_1", "ferrite_mla_attn_f32_2", "ferrite_mla_attn_f32_4"},
	{"ferrite_mla_attn_bf16_1", "ferrite_mla_attn_bf16_2", "ferrite_mla_attn_bf16_4"},
}

// rotArgs are r's kernel arguments: inverse frequencies (0 for nil), pairs,
// interleaving and scale.
func rotArgs(op string, r *kernels.Rotary) (inv uint64, half int, inter bool, scale float32) {
	if r == nil {
		return 0, 0, false, 1
	}
	f32Contig(op+" rotary", r.InvFreq)
	if r.Dim%2 != 0 || r.InvFreq.Elems() != r.Dim/2 {
		panic("cuda: " + op + " rotary frequencies do not match its dim")
	}
	return dptr(r.InvFreq), r.Dim / 2, r.Interleaved, r.Scale
}

// cacheDType panics unless c is a contiguous F32 or BF16 cache and reports
// whether it is BF16.
func cacheDType(op string, c kernels.Tensor) bool {
	if (c.DType != kernels.F32 && c.DType != kernels.BF16) || !c.Contiguous() {
		panic("cuda: " + op + " cache must be contiguous F32 or BF16, got " + c.String())
	}
	return c.DType == kernels.BF16
}

// storeRows checks the row maps of a cache store of n rows.
func storeRows(op string, x kernels.Tensor, p *kernels.Paged) {
	if x.DType != kernels.F32 {
		panic("cuda: " + op + " wants F32 rows, got " + x.String())
	}
	index(op, p.Pos, x.Rows, 1)
	index(op, p.Slot, x.Rows, 1)
}

// StoreLatent implements kernels.MLAOps.
func (b *Backend) StoreLatent(cache, kv, norm kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	f32Contig("StoreLatent norm", norm)
	storeRows("StoreLatent", kv, p)
	bf := cacheDType("StoreLatent", cache)
	kl, w := norm.Elems(), kv.Cols
	inv, half, inter, scale := rotArgs("StoreLatent", r)
	if cache.Cols != w || w-kl != 2*half || kl <= 0 {
		panic("cuda: StoreLatent shapes do not match")
	}
	n := kv.Rows
	if n == 0 {
		return
	}
	c, x, np, pos, slot := dptr(cache), dptr(kv), dptr(norm), dptr(p.Pos), dptr(p.Slot)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_mla_store_latent", uint32(n), 256, 0, c, b32(bf), i32(cache.Rows), x, i32(kv.Stride), np,
			i32(kl), i32(w), f32(eps), pos, i32(p.Pos.Stride), slot, i32(p.Slot.Stride), inv, i32(half), b32(inter), f32(scale))
	})
}

// StoreIndexKey implements kernels.SparseOps.
func (b *Backend) StoreIndexKey(cache, k, w, bias kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	f32Contig("StoreIndexKey", w, bias)
	storeRows("StoreIndexKey", k, p)
	bf := cacheDType("StoreIndexKey", cache)
	dim := k.Cols
	inv, half, inter, scale := rotArgs("StoreIndexKey", r)
	if cache.Cols != dim || w.Elems() != dim || bias.Elems() != dim || 2*half > dim {
		panic("cuda: StoreIndexKey shapes do not match")
	}
	n := k.Rows
	if n == 0 || dim == 0 {
		return
	}
	c, x, wp, bp, pos, slot := dptr(cache), dptr(k), dptr(w), dptr(bias), dptr(p.Pos), dptr(p.Slot)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_dsa_store_key", uint32(n), 256, 0, c, b32(bf), i32(cache.Rows), x, i32(k.Stride), wp, bp,
			i32(dim), f32(eps), pos, i32(p.Pos.Stride), slot, i32(p.Slot.Stride), inv, i32(half), b32(inter), f32(scale))
	})
}

// pagedRows checks the row maps an attention-like op reads for n rows and
// returns them: positions, sequences, block table.
func pagedRows(op string, p *kernels.Paged, n int) (pos, seq, bt uint64) {
	index(op, p.Pos, n, 1)
	index(op, p.Seq, n, 1)
	if !p.Blocks.Contiguous() || p.Blocks.DType != kernels.I32 || p.BlockSize <= 0 {
		panic("cuda: " + op + " block table")
	}
	if n > 1 && (p.Pos.Stride != 1 || p.Seq.Stride != 1) {
		panic("cuda: " + op + " wants contiguous positions and sequences")
	}
	return dptr(p.Pos), dptr(p.Seq), dptr(p.Blocks)
}

// projArgs are the weight arguments of ferrite_mla_proj: data, F8E4M3
// scales (0 otherwise), dtype, width, block rows and columns (at least 1)
// and the first row of head 0.
func projArgs(w *Weight, row0 int) []uint64 {
	var scale uint64
	if w.Scale != nil {
		scale = w.Scale.ptr
	}
	return []uint64{w.Buf.ptr, scale, i32(int(w.DType)), i32(w.Cols), i32(max(w.BlockRows, 1)), i32(max(w.BlockCols, 1)), i32(row0)}
}

// mlaUK holds, per kv_b_proj, its W_UK halves transposed in device memory:
// (heads·kl, dn), head h's rows h·kl … (h+1)·kl − 1 being W_UK_hᵀ, so that
// the absorbed query W_UK_hᵀ·q_nope is a per-head matrix-vector product
// with contiguous rows like the output's W_UV_h·lat. Made on the device
// from the uploaded weight (ferrite_mla_uk_t), so weights generated in
// device memory need no host bytes.
type mlaUK struct {
	mu sync.Mutex
	m  map[*kernels.Mat]*Weight
}

// ukWeight returns kvB's transposed W_UK (dw is kvB on the device), made on
// first use: F32, BF16 and F16 keep their bits, other dtypes become F32.
func (b *Backend) ukWeight(kvB *kernels.Mat, dw *Weight, s kernels.MLAShape) (*Weight, error) {
	u := &b.mlaUK
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.m[kvB]; w != nil {
		return w, nil
	}
	dt := dw.DType
	if dt != kernels.F32 && dt != kernels.BF16 && dt != kernels.F16 {
		dt = kernels.F32
	}
	n := s.Heads * s.KVLora * s.Nope
	buf, err := b.dev.Alloc(int64(max(n*dt.Size(), 4)))
	if err != nil {
		return nil, err
	}
	var scale uint64
	if dw.Scale != nil {
		scale = dw.Scale.ptr
	}
	err = b.dev.do(func() error {
		return b.dev.launchL("ferrite_mla_uk_t", b.dev.elementwiseGrid(int64(n)), 256, 0, buf.ptr, dw.Buf.ptr, scale,
			i32(int(dw.DType)), i32(s.Heads), i32(s.Nope), i32(s.V), i32(s.KVLora), i32(max(dw.BlockRows, 1)), i32(max(dw.BlockCols, 1)))
	})
	if err != nil {
		buf.Free()
		return nil, err
	}
	w := &Weight{Buf: buf, DType: dt, Rows: s.Heads * s.KVLora, Cols: s.Nope}
	b.mem.weights.Add(w.Bytes())
	if u.m == nil {
		u.m = map[*kernels.Mat]*Weight{}
	}
	u.m[kvB] = w
	return w, nil
}

// kvbWeights returns kv_b_proj's halves as its file stores them
// (kvB.KVB, a GGUF's attn_k_b and attn_v_b) on the device, every head's
// part stacked by rows: uk (heads·kl, dn), head h's W_UK_hᵀ at rows h·kl…
// (the layout ukWeight makes), and uv (heads·dv, kl), head h's W_UV_h at
// rows h·dv…. A block-quantized half keeps its blocks (UploadQuant, for
// ferrite_mla_proj_q), a float half its bits; ok is false where kvB has
// no such halves or one cannot stay as it is (another shape, mixed
// dtypes, rows of partial blocks, FERRITE_CUDA_QUANT=0 or
// FERRITE_CUDA_KVB=0), and AttentionMLA
// then uploads the whole matrix, which for a quantized half is float32:
// GLM-4.7-Flash's 18.4 MB a layer against 4.9 in Q8_0.
func (b *Backend) kvbWeights(kvB *kernels.Mat, s kernels.MLAShape) (uk, uv *Weight, ok bool, err error) {
	hs := kvB.KVB
	if hs == nil || !kvbOn || s.Nope == 0 || !kvbHalfOK(hs.UK, s.Heads, s.KVLora, s.Nope) || !kvbHalfOK(hs.UV, s.Heads, s.V, s.KVLora) {
		return nil, nil, false, nil
	}
	upload := func(ms []*kernels.Mat) (*Weight, error) {
		return cachedWeight(b, &b.kvbParts, ms[0], func() (*Weight, error) {
			if ms[0].DType.Quantized() {
				return b.dev.UploadQuant(ms)
			}
			return b.dev.UploadStack(ms)
		})
	}
	if uk, err = upload(hs.UK); err == nil {
		uv, err = upload(hs.UV)
	}
	return uk, uv, err == nil, err
}

// kvbHalfOK reports whether ms, one half of a kv_b_proj stored split
// (kernels.KVBHeads), can go to the device as it is: heads parts of rows ×
// cols in one dtype, block-quantized in whole blocks the quantized kernels
// take (quantable), or F32, BF16 or F16.
func kvbHalfOK(ms []*kernels.Mat, heads, rows, cols int) bool {
	if len(ms) != heads || heads == 0 {
		return false
	}
	for _, m := range ms {
		if m.DType != ms[0].DType || m.Rows != rows || m.Cols != cols || m.Data == nil {
			return false
		}
	}
	switch dt := ms[0].DType; {
	case dt.Quantized():
		return quantable(ms...)
	default:
		return dt == kernels.F32 || dt == kernels.BF16 || dt == kernels.F16
	}
}

// AttentionMLA implements kernels.MLAOps in the absorbed form, whatever
// s.Form asks (both forms compute the same attention; the form is a choice
// of cost, and on the GPU the absorbed one wins at every shape: its latent
// attention reads each latent once for a group of heads, while the naive
// form's expanded keys would be read per head and per row). The steps: q_pe
// rotated in place (ferrite_rope on the heads' tails); the absorbed queries
// W_UK_hᵀ·q_nope (a per-head projection over the transposed W_UK,
// ukWeight); the latent attention split over the keys (tcPlan: on tensor
// cores, merged by ferrite_mla_merge; else ferrite_mla_attn_*, merged by
// ferrite_mla_combine); then W_UV_h·lat per head over kv_b_proj. The
// projections are ferrite_mla_proj_tc for BF16 weights, ferrite_mla_proj_q
// (_1, _8) for a GGUF's block-quantized halves (kvbWeights), else ferrite_mla_proj;
// FERRITE_MLA_TC=0 keeps every step off the tensor cores.
func (b *Backend) AttentionMLA(out, q, cache kernels.Tensor, kvB *kernels.Mat, r *kernels.Rotary, p *kernels.Paged, s kernels.MLAShape, sel kernels.Tensor) {
	f32Contig("AttentionMLA", out, q)
	bf := cacheDType("AttentionMLA", cache)
	n, hd, kl, kw := q.Rows, s.Nope+s.Rope, s.KVLora, s.KVLora+s.Rope
	inv, half, inter, rscale := rotArgs("AttentionMLA", r)
	switch {
	case s.Heads <= 0 || kl <= 0 || q.Cols != s.Heads*hd || out.Cols != s.Heads*s.V || out.Rows != n || cache.Cols != kw:
		panic("cuda: AttentionMLA shapes do not match")
	case kvB.Rows != s.Heads*(s.Nope+s.V) || kvB.Cols != kl || 2*half != s.Rope:
		panic("cuda: AttentionMLA kv_b_proj or rotary does not match the shape")
	case kl > mlaMaxKL:
		panic("cuda: AttentionMLA kv_lora_rank above 1024")
	}
	pos, seq, bt := pagedRows("AttentionMLA", p, n)
	var selp uint64
	keys := p.Blocks.Cols * p.BlockSize // the most keys a row attends to
	if sel.Valid() {
		index("AttentionMLA selection", sel, n, sel.Cols)
		if !sel.Contiguous() {
			panic("cuda: AttentionMLA selection must be contiguous")
		}
		selp, keys = dptr(sel), sel.Cols
	}
	if n == 0 {
		return
	}
	// W_UK_hᵀ (uk) and W_UV_h (uv, head h's rows from h·vStride + vRow0):
	// the halves as the file stores them, or kv_b_proj's own rows and
	// their transposition.
	uk, uv, split, err := b.kvbWeights(kvB, s)
	vStride, vRow0 := s.V, 0
	if err == nil && !split {
		vStride, vRow0 = s.Nope+s.V, s.Nope
		if uv, err = b.weight(kvB); err == nil && s.Nope > 0 {
			uk, err = b.ukWeight(kvB, uv, s)
		}
	}
	if err != nil {
		b.fail(err)
		return
	}
	// lat (n, heads, kl), the attended latents, takes the place of the
	// absorbed queries qc W_UK_hᵀ·q_nope (none without q_nope dims: zero):
	// an attention block stages its rows' queries before it writes their
	// latents, and with several splits the merge writes them after every
	// block has run. A long prefill step keeps one such buffer per layer.
	lat := dptr(b.Scratch(kernels.F32, n*s.Heads, kl))
	var qc uint64
	if uk != nil {
		qc = lat
	}
	o, qp := dptr(out), dptr(q)
	var attend func(d *Device) error
	if tc := b.tcPlan(bf, s, n, keys); tc.nt > 0 {
		attend = b.mlaTCAttend(tc, lat, qc, qp, dptr(cache), pos, seq, bt, selp, keys, p, s, n)
	} else {
		attend = b.mlaAttend(bf, lat, qc, qp, dptr(cache), pos, seq, bt, selp, keys, p, s, n)
	}
	// proj launches y = W_h·x_h per head (ferrite_mla_proj's arguments):
	// for several rows and a BF16 weight on tensor cores, 8 or 32 query
	// rows a block; for one row, and for every row with SetRowExact (so
	// that each gets the one-row bits), the GEMV, which measured faster
	// for one row (GPU run 2: 8.8 + 8.1 against 13.3 + 11.1 µs a layer).
	projTC := mlaTCEnabled && !b.mlaNoTC && !b.rowExact && n > 1
	nq, projName := 4, "ferrite_mla_proj_tc_32"
	if n <= 8 {
		nq, projName = 1, "ferrite_mla_proj_tc_8"
	}
	proj := func(d *Device, y uint64, yRS, yHS int, x uint64, xRS, xHS, rows, wHRows, row0 int, w *Weight) error {
		if w.DType.Quantized() { // a GGUF's half in its blocks (kvbWeights; row0 is 0), one row or 8 a block
			name, nb := "ferrite_mla_proj_q_1", 1
			if n > 1 {
				name, nb = "ferrite_mla_proj_q_8", 8
			}
			return d.launch3L(name, [3]uint32{uint32(ceilDiv(rows, mlaRows)), uint32(s.Heads), uint32(ceilDiv(n, nb))}, 256, 0,
				y, i32(yRS), i32(yHS), x, i32(xRS), i32(xHS), i32(n), i32(rows), i32(wHRows), w.Buf.ptr, w.Buf.ptr+uint64(w.DOff), i32(int(w.DType)), i32(w.Cols))
		}
		if smem := mlaProjSmem(w.Cols, nq); projTC && w.DType == kernels.BF16 && w.Cols%16 == 0 && xRS%2 == 0 && xHS%2 == 0 && smem <= b.dev.SmemOptIn {
			return d.launch3L(projName, [3]uint32{uint32(ceilDiv(rows, 32)), uint32(s.Heads), uint32(ceilDiv(n, 8*nq))},
				256, uint32(smem), y, i32(yRS), i32(yHS), x, i32(xRS), i32(xHS), i32(n), i32(rows), i32(wHRows),
				w.Buf.ptr, i32(w.Cols), i32(row0))
		}
		args := append([]uint64{y, i32(yRS), i32(yHS), x, i32(xRS), i32(xHS), i32(n), i32(rows), i32(wHRows)}, projArgs(w, row0)...)
		return d.launch3L("ferrite_mla_proj", [3]uint32{uint32(ceilDiv(rows, mlaRows)), uint32(s.Heads), uint32(ceilDiv(n, mlaRows))}, 256, 0, args...)
	}
	b.queue(func(d *Device) error {
		if half > 0 { // q_pe: the last Rope dims of every head
			total := int64(n) * int64(s.Heads) * int64(half)
			err := d.launchL("ferrite_rope", d.elementwiseGrid(total), 256, 0, qp+uint64(4*s.Nope), pos, i32(p.Pos.Stride), inv,
				i32(n), i32(s.Heads), i32(hd), i32(half), b32(inter), f32(rscale))
			if err != nil {
				return err
			}
		}
		if uk != nil {
			if err := proj(d, qc, s.Heads*kl, kl, qp, s.Heads*hd, hd, kl, kl, 0, uk); err != nil {
				return err
			}
		}
		if err := attend(d); err != nil {
			return err
		}
		return proj(d, o, s.Heads*s.V, s.V, lat, s.Heads*kl, kl, s.V, vStride, vRow0, uv)
	})
}

// mlaAttend returns the launches of the CUDA-core latent attention
// (ferrite_mla_attn_*, ferrite_mla_combine) into lat.
func (b *Backend) mlaAttend(bf bool, lat, qc, qp, cache, pos, seq, bt, selp uint64, keys int, p *kernels.Paged, s kernels.MLAShape, n int) func(d *Device) error {
	kl, kw := s.KVLora, s.KVLora+s.Rope
	gs := min(mlaGroup, mlaSmem/(kw*4))
	if gs == 0 {
		panic("cuda: AttentionMLA latent rows too wide for shared memory")
	}
	groups := ceilDiv(s.Heads, gs)
	gs = ceilDiv(s.Heads, groups) // balance the groups
	dpt := 0
	for 256<<dpt < kl {
		dpt++
	}
	// Enough splits of at least mlaSplit keys for about two blocks per
	// multiprocessor; every split then takes an equal share of the keys
	// (whole tiles), so that together they cover all of them.
	splits := max(1, min(ceilDiv(keys, mlaSplit), ceilDiv(2*b.dev.SMs, n*groups)))
	split := ceilDiv(ceilDiv(keys, splits), mlaTile) * mlaTile
	var part uint64
	if splits > 1 {
		part = dptr(b.Scratch(kernels.F32, n*s.Heads*splits, kl+2)) // (n, heads, splits, max, sum, kl sums)
	}
	return func(d *Device) error {
		err := d.launch3L(mlaAttnKernels[b2i(bf)][dpt], [3]uint32{uint32(n), uint32(groups), uint32(splits)}, 256, uint32(gs*kw*4),
			lat, part, qc, qp, cache, pos, seq, bt, selp, i32(keys), i32(p.Blocks.Cols), i32(p.BlockSize), i32(s.Heads),
			i32(gs), i32(kl), i32(s.Nope), i32(s.Rope), i32(split), f32(s.Scale))
		if err != nil || splits == 1 {
			return err
		}
		return d.launch3L("ferrite_mla_combine", [3]uint32{uint32(n), uint32(s.Heads), 1}, 128, 0,
			lat, part, i32(s.Heads), i32(kl), i32(splits))
	}
}

// mlaTCPlan is the launch shape of the tensor-core latent attention: head
// groups of gs ≤ 8·nt, splits of split keys, smem bytes of shared memory a
// block.
type mlaTCPlan struct {
	nt, gs, groups, splits, split, smem int
}

// tcPlan plans the tensor-core latent attention of n rows over up to keys
// keys; nt = 0 when it does not apply (another shape or an odd
// qk_nope_head_dim — the kernel reads the query in pairs —, an F32 cache,
// FERRITE_MLA_TC=0, or too little shared memory).
func (b *Backend) tcPlan(bf bool, s kernels.MLAShape, n, keys int) mlaTCPlan {
	if !bf || !mlaTCEnabled || b.mlaNoTC || s.KVLora != mlaTCLatent || s.Rope != mlaTCRope || s.Nope%2 != 0 {
		return mlaTCPlan{}
	}
	// With SetRowExact the rows are planned as a row alone would be, so
	// that a verification's rows get plain decoding's bits (a head's sums
	// depend on its row and the splits only, not on its group).
	if b.rowExact {
		n = 1
	}
	// Up to 32 heads a block; 8 for a few rows, whose blocks are then
	// more and lighter (GPU run 3, BenchmarkMLADecode, 1 row at context
	// 192: 30.8 against 34.5 µs a layer).
	heads := mlaTCHeads
	if n <= 4 {
		heads = 8
	}
	if b.mlaHeads > 0 {
		heads = b.mlaHeads
	}
	t := mlaTCPlan{groups: ceilDiv(s.Heads, min(heads, mlaTCHeads))}
	t.gs = ceilDiv(s.Heads, t.groups)
	t.nt = ceilDiv(t.gs, 8)
	t.smem = mlaTCSmem(t.nt)
	if t.smem > b.dev.SmemOptIn {
		return mlaTCPlan{}
	}
	// A block or two a multiprocessor (the shared memory allows no more):
	// as many splits of whole key tiles as fill them once, at least
	// mlaTiles tiles each.
	tiles := max(1, ceilDiv(keys, mlaTCKeys))
	t.splits = 1
	if c := b.dev.SMs / (n * t.groups); c > 1 {
		t.splits = min(ceilDiv(tiles, max(1, b.mlaTiles)), c)
	}
	if b.mlaSplitCap > 0 {
		t.splits = min(t.splits, b.mlaSplitCap)
	}
	t.split = ceilDiv(tiles, t.splits) * mlaTCKeys
	return t
}

// mlaTCAttend returns the launches of the tensor-core latent attention
// (ferrite_mla_tc_*, ferrite_mla_merge) into lat.
func (b *Backend) mlaTCAttend(t mlaTCPlan, lat, qc, qp, cache, pos, seq, bt, selp uint64, keys int, p *kernels.Paged, s kernels.MLAShape, n int) func(d *Device) error {
	var part, ml uint64
	if t.splits > 1 {
		part = dptr(b.Scratch(kernels.F32, n*s.Heads*t.splits, mlaTCLatent)) // (n, heads, splits, 512) unnormalised sums
		ml = dptr(b.Scratch(kernels.F32, n*s.Heads*t.splits, 2))             // (n, heads, splits, 2) max and sum
	}
	name := mlaTCKernels[t.nt-1]
	return func(d *Device) error {
		err := d.launch3L(name, [3]uint32{uint32(n), uint32(t.groups), uint32(t.splits)}, 256, uint32(t.smem),
			lat, part, ml, qc, qp, cache, pos, seq, bt, selp, i32(keys), i32(p.Blocks.Cols), i32(p.BlockSize), i32(s.Heads),
			i32(t.gs), i32(s.Nope), i32(t.split), f32(s.Scale))
		if err != nil || t.splits == 1 {
			return err
		}
		return d.launch3L("ferrite_mla_merge", [3]uint32{uint32(n), uint32(s.Heads), 1}, 128, uint32(4*t.splits),
			lat, part, ml, i32(s.Heads), i32(mlaTCLatent), i32(t.splits))
	}
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// IndexerScores implements kernels.SparseOps.
func (b *Backend) IndexerScores(scores, q, w, keys kernels.Tensor, p *kernels.Paged, s kernels.IndexerShape) {
	f32Contig("IndexerScores", scores, q, w)
	bf := cacheDType("IndexerScores keys", keys)
	n, L := q.Rows, scores.Cols
	if s.Heads <= 0 || q.Cols != s.Heads*s.Dim || w.Cols != s.Heads || w.Rows != n || scores.Rows != n || keys.Cols != s.Dim {
		panic("cuda: IndexerScores shapes do not match")
	}
	pos, seq, bt := pagedRows("IndexerScores", p, n)
	if n == 0 || L == 0 {
		return
	}
	smem := s.Heads * s.Dim * 4
	staged := smem <= 48<<10
	if !staged {
		smem = 0
	}
	name := "ferrite_dsa_scores_f32"
	if bf {
		name = "ferrite_dsa_scores_bf16"
	}
	sp, qp, wp, kp := dptr(scores), dptr(q), dptr(w), dptr(keys)
	b.queue(func(d *Device) error {
		return d.launch3L(name, [3]uint32{uint32(n), uint32(ceilDiv(L, 128)), 1}, 128, uint32(smem), sp, i32(L), qp, wp, kp,
			pos, seq, bt, i32(p.Blocks.Cols), i32(p.BlockSize), i32(s.Heads), i32(s.Dim), f32(s.Scale), i32(s.TopK), b32(staged))
	})
}

// TopK implements kernels.SparseOps: one block per row, a radix select
// (src/ops_mla.cu, ferrite_topk) with kernels/ref.SelectTopK's order.
func (b *Backend) TopK(sel, scores kernels.Tensor) {
	if scores.DType != kernels.F32 {
		panic("cuda: TopK wants F32 scores, got " + scores.String())
	}
	index("TopK", sel, scores.Rows, sel.Cols)
	if !sel.Contiguous() {
		panic("cuda: TopK wants a contiguous selection")
	}
	n, k := sel.Rows, sel.Cols
	if n == 0 || k == 0 {
		return
	}
	sp, sc := dptr(sel), dptr(scores)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_topk", uint32(n), topKThread, 0, sp, i32(k), sc, i32(scores.Stride), i32(scores.Cols))
	})
}

// ReadI32 implements kernels.SparseOps: it waits for queued work, then
// copies. After a device failure dst is filled with −1.
func (b *Backend) ReadI32(dst []int32, t kernels.Tensor) {
	if t.DType != kernels.I32 || len(dst) != t.Elems() {
		panic("cuda: ReadI32 wants an I32 tensor of len(dst) elements")
	}
	var raw []byte
	if len(dst) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst))
	}
	if !b.read(raw, t) {
		for i := range dst {
			dst[i] = -1
		}
	}
}
