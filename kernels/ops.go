package kernels

// The op set: coarse, fused, layer-level operations on tensors the backend
// owns. A model is written once against these interfaces; the CPU backend
// (kernels/cpu) implements them, kernels/ref holds their golden references,
// kernels/strict checks that a model uses nothing else, and every
// implementation passes the per-op conformance suite in kernels/kerneltest.
//
// Rules every op follows, so that a GPU can run a step from captured
// launches:
//   - Shapes, dtypes and the small parameters (eps, scale, head counts) are
//     host values fixed by the model; everything that depends on the batch's
//     contents (token ids, positions, block tables, cache slots, expert
//     routes, logit rows) is a tensor. No op returns data to the host.
//   - Activations, norms, softmax and router scores are F32 and accumulate
//     in F32 (float64 where a reference does); weights stay in their stored
//     dtype (*Mat) and are converted inside the kernel; the KV cache is F32
//     or BF16.
//   - An op writes every element of its destination rows; destinations never
//     alias inputs unless the op says so.
//   - Malformed calls (shape or dtype mismatch) are programmer errors and
//     panic with a constant "kernels: ..." message.
//
// Device embeds the capabilities the GQA family needs (dense and MoE). The
// interfaces after it are the rest of the op set, discovered by type
// assertion and implemented by kernels/cpu and kernels/strict: MLAOps and
// SparseOps (the MLA family: glm4_moe_lite, deepseek_v32, glm_moe_dsa;
// glm5_next's NoPE MLA), LinearAttentionOps (qwen3_next, glm5_next's KDA),
// and KPoolOps, HyperOps and ClampOps (glm5_next). The architectures that
// need them check for them at load. SampleOps reduce logit rows for the
// sampler; a model without them returns the rows.

// Device is a backend that owns tensor memory and runs the op set. It also
// implements the host-slice Backend (MatMul, Parallel), which load-time work
// (quantizing weights, touching pages) and the MatMul conformance suite
// use; no forward pass does.
type Device interface {
	Backend
	Memory
	LinearOps
	NormOps
	RopeOps
	AttentionOps
	MoEOps
}

// Memory allocates tensors and moves values between host and backend.
type Memory interface {
	// Alloc returns zeroed persistent storage (weights converted at load,
	// KV cache, recurrent state) that lives until Free or until the Device
	// closes.
	Alloc(dt DType, rows, cols int) (Tensor, error)

	// Free releases the persistent storage of t, a tensor from Alloc (or a
	// view of one: the whole storage goes), outside a step. Using t or any
	// view of it afterwards, or freeing it twice, is a programmer error
	// (a backend that notices panics with an error wrapping ErrFreed). Scratch tensors are
	// not freed this way: BeginStep releases them.
	Free(t Tensor)

	// Scratch returns a tensor from the per-step arena, with unspecified
	// contents, valid until the next BeginStep. The arena grows to the
	// largest step seen and then stops allocating.
	Scratch(dt DType, rows, cols int) Tensor

	// BeginStep starts a forward pass: it releases every Scratch tensor.
	// EndStep finishes it; on an asynchronous device it waits for the
	// pass's work. Write and Read are allowed only outside a step.
	BeginStep()
	EndStep()

	// WriteF32 and WriteI32 copy host values into t (F32 or I32, len(src)
	// = t.Elems()), row after row.
	WriteF32(t Tensor, src []float32)
	WriteI32(t Tensor, src []int32)
	// ReadF32 copies t (F32, len(dst) = t.Elems()) into host memory.
	ReadF32(dst []float32, t Tensor)

	// Copy sets dst to src (same dtype and shape) on the backend, for
	// example a KV-cache block's copy-on-write.
	Copy(dst, src Tensor)
}

// Epilogue is what a linear op does with x·Wᵀ before writing it.
type Epilogue struct {
	Bias       Tensor // (1, out) F32 added to every row; zero Tensor for none
	Accumulate bool   // dst += result (a residual add) instead of dst = result
}

// LinearOps are matrix products with the weights in their stored dtype.
type LinearOps interface {
	// Linear sets dst (N, w.Rows) = x (N, w.Cols)·wᵀ (+ Bias) or adds it
	// to dst when e.Accumulate. x and dst are F32 and contiguous.
	Linear(dst, x Tensor, w *Mat, e Epilogue)

	// LinearCat sets dst (N, Σ ws[i].Rows) = x (N, in)·[ws[0]; ws[1]; …]ᵀ
	// (+ Bias, (1, Σ rows)) or adds it when e.Accumulate: the products of
	// one input with several weights of one dtype and width (q/k/v), side
	// by side in each row of dst. A backend may keep the weights stacked as
	// one matrix (read in one pass), cached per list of weights, so ws are
	// weights, never Transient. x and dst are F32 and contiguous.
	LinearCat(dst, x Tensor, ws []*Mat, e Epilogue)

	// SwiGLU sets dst (N, inter) = silu(gate)·up for gate and up (N, inter),
	// F32. dst may be gate.
	SwiGLU(dst, gate, up Tensor)

	// SwiGLULinear is a SwiGLU MLP's first half in one op: dst (N, inter) =
	// silu(min(g, L))·clamp(u, −L, L) for g = x·gateᵀ, u = x·upᵀ (x (N,
	// hidden); gate and up (inter, hidden) of one dtype), or silu(g)·u when
	// limit L is 0 (the clamp of kernels.ClampOps.SwiGLUClamp). gate and up
	// may be kept stacked like LinearCat's weights (never Transient). x and
	// dst are F32 and contiguous.
	SwiGLULinear(dst, x Tensor, gate, up *Mat, limit float32)

	// NormLinearCat is LinearCat(dst, RMSNorm(x, n), ws, e) in one op, x
	// (N, in) F32 the un-normed rows and n the norm (weight (1, in)): a
	// pre-norm block's norm fused into the product that reads it, so that
	// no normed copy of x is written. A backend may apply the norm's scale
	// after the sums, dst = rsqrt(mean(x²) + eps)·(w ⊙ x)·Wᵀ, which
	// differs from the two ops by rounding only (kerneltest holds it to
	// LinearTol over the normed row). x is not modified; dst must not
	// alias it.
	NormLinearCat(dst, x Tensor, n *HeadNorm, ws []*Mat, e Epilogue)

	// AddNormLinearCat is a pre-norm block's pending residual add fused
	// with NormLinearCat: sum = x + delta (N, in; each element one float32
	// add, as AddRMSNorm adds), then NormLinearCat(dst, sum, n, ws, e).
	// sum must not alias x, delta or dst: a backend's blocks may all read x
	// and delta while sum is being written.
	AddNormLinearCat(dst, sum, x, delta Tensor, n *HeadNorm, ws []*Mat, e Epilogue)

	// NormSwiGLULinear is SwiGLULinear(dst, RMSNorm(x, n), gate, up,
	// limit) in one op, as NormLinearCat fuses LinearCat's.
	NormSwiGLULinear(dst, x Tensor, n *HeadNorm, gate, up *Mat, limit float32)

	// Embed sets dst (N, w.Cols) F32 to the rows of w named by ids (N, 1)
	// I32: dst[i] = w[ids[i]].
	Embed(dst Tensor, w *Mat, ids Tensor)

	// GatherRows sets dst (M, C) = src[rows[i]] for rows (M, 1) I32 and
	// src (N, C) F32: the logit-row gather before the LM head.
	GatherRows(dst, src, rows Tensor)
}

// NormOps are row normalisations, F32 in and out, with a float64 sum of
// squares.
type NormOps interface {
	// RMSNorm sets dst (R, D) = w ⊙ x·rsqrt(mean(x²) + eps) over rows of x
	// (R, D), w (1, D) F32; with offset the scale is 1 + w (zero-centred
	// norms). A per-head norm reshapes (N, heads·D) to (N·heads, D). dst may
	// be x.
	RMSNorm(dst, x, w Tensor, eps float32, offset bool)

	// AddRMSNorm is the pre-norm block's fused residual step:
	// res += delta, then dst = RMSNorm(res). res, delta, dst are (R, D).
	AddRMSNorm(dst, res, delta, w Tensor, eps float32, offset bool)
}

// Rotary is a rotary position embedding as the ops see it. cos and sin are
// computed from InvFreq in the kernel: angle = float32(pos)·InvFreq[i],
// cos = float32(cos(angle))·Scale (and sin alike), so no table has to
// cover the context. Linear, llama3 and YaRN scalings and partial rotation
// are all expressed through InvFreq, Dim and Scale. InvFreq is written once
// at load; a backend may cache tables derived from it.
type Rotary struct {
	InvFreq     Tensor  // (1, Dim/2) F32 inverse frequencies
	Dim         int     // rotated dims: the first Dim of each head (even)
	Interleaved bool    // pairs (2i, 2i+1) (GPT-J) rather than (i, i+Dim/2) (NeoX)
	Scale       float32 // multiplies cos and sin (YaRN attention factor; 1 otherwise)
}

// RotatedDims is r.Dim, or 0 for a nil r (no rotation).
func (r *Rotary) RotatedDims() int {
	if r == nil {
		return 0
	}
	return r.Dim
}

// RopeOps rotate query and key heads.
type RopeOps interface {
	// RoPE rotates, in place, every head of x (N, heads·headDim) F32 at
	// its row's position pos (N, 1) I32.
	RoPE(x Tensor, heads, headDim int, pos Tensor, r *Rotary)
}

// Paged maps the rows of a step's flattened batch to the paged KV cache.
// Rows of one sequence are consecutive and in position order. A cache
// layer is a (blocks·BlockSize, width) tensor: slot b·BlockSize + j holds
// token j of block b.
type Paged struct {
	Pos       Tensor // (N, 1) I32 absolute position of each row
	Seq       Tensor // (N, 1) I32 index of each row's sequence into Blocks
	Slot      Tensor // (N, 1) I32 cache slot each row's k/v is stored in
	Blocks    Tensor // (seqs, maxBlocks) I32 block table of each sequence
	BlockSize int    // token slots per block
}

// AttnShape is a GQA attention layer: query head h reads KV head
// h/(Heads/KVHeads).
type AttnShape struct {
	Heads, KVHeads, HeadDim int
	Scale                   float32 // softmax scale, usually HeadDim^-½
}

// HeadNorm is an RMSNorm's parameters as an op takes them: a per-head
// norm (Qwen3's q_norm and k_norm, weight (1, headDim) F32, applied to
// every head as NormOps.RMSNorm does) or a row's norm fused into a linear
// op (LinearOps.NormLinearCat: weight (1, in)).
type HeadNorm struct {
	W      Tensor
	Eps    float32
	Offset bool
}

// AttentionOps are paged causal attention over the KV cache.
type AttentionOps interface {
	// PrepareQKV is the step between the fused q/k/v projection and
	// Attention, in one op: for every row of qkv (N, (Heads + 2·KVHeads)·
	// HeadDim) F32, laid out [q | k | v], it normalises each q head with qn
	// and each k head with kn (RMSNorm; nil for none), rotates q and k at
	// p.Pos with r (nil for none), writes q into q (N, Heads·HeadDim) F32
	// and stores k and v into the cache layer kc, vc at p.Slot exactly as
	// RMSNorm, RoPE and StoreKV in sequence would. qkv is not modified.
	PrepareQKV(q, kc, vc, qkv Tensor, qn, kn *HeadNorm, r *Rotary, p *Paged, s AttnShape)

	// QKVAttention is PrepareQKV then Attention in one op: out (N,
	// Heads·HeadDim) is what Attention gives for the q PrepareQKV makes of
	// qkv, after it stored the rows' keys and values into kc, vc, with the
	// bits of the two ops (a backend fuses them where it can: the batch-1
	// decode step). qkv is not modified.
	QKVAttention(out, kc, vc, qkv Tensor, qn, kn *HeadNorm, r *Rotary, p *Paged, s AttnShape)

	// StoreKV writes k and v (N, KVHeads·HeadDim) F32 into the cache layer
	// kc, vc (slots, KVHeads·HeadDim), F32 or BF16 (rounded to nearest
	// even), at each row's p.Slot.
	StoreKV(kc, vc, k, v Tensor, p *Paged)

	// Attention sets out (N, Heads·HeadDim) to the causal attention of
	// every row's query q (N, Heads·HeadDim) F32 over its sequence's cached
	// keys and values at positions [0, Pos[i]]; the step's own k/v must be
	// stored first. Softmax is max-subtracted in F32.
	Attention(out, q, kc, vc Tensor, p *Paged, s AttnShape)
}

// Scoring is how a router turns logits into expert scores.
type Scoring uint8

const (
	// SoftmaxScoring: p = softmax(logits) over all experts (Mixtral, Qwen-MoE).
	SoftmaxScoring Scoring = iota
	// SigmoidScoring: s = sigmoid(logits) per expert (DeepSeek-V3, GLM-4.5
	// noaux_tc), optionally biased for selection.
	SigmoidScoring
)

// Router picks TopK experts per token and their weights. Softmax: take the
// top-k of softmax(logits), renormalised to sum 1 when NormTopK. Sigmoid
// (noaux_tc): s = sigmoid(logits); selection uses s + Bias; with Groups > 1
// only the TopKGroups groups with the best sum of their two best biased
// scores stay eligible; the weights are the unbiased s, divided by their sum
// + 1e-20 when NormTopK. Both then multiply by Scale. Ties go to the lower
// expert id. Shared > 0 appends, after a token's TopK routed experts, the
// experts every token takes: ids experts, experts + 1, … (the expert list
// given to Experts holds them after the routed ones) with weight 1.
type Router struct {
	Bias       Tensor // (1, experts) F32 selection bias; zero Tensor for none
	Scoring    Scoring
	TopK       int
	NormTopK   bool
	Scale      float32 // routed_scaling_factor; 1 for none
	Groups     int     // n_group; ≤ 1 disables grouped selection
	TopKGroups int     // topk_group
	Shared     int     // shared experts folded into the routed ones (SharedExperts); 0 for none
}

// Width is the columns of Route's ids and weights: TopK + Shared.
func (r *Router) Width() int { return r.TopK + r.Shared }

// SharedExperts is implemented by a backend whose Experts runs an expert
// that every token of the call takes (Router.Shared) at least as fast as
// the separate dense SwiGLU MLP: a model then folds its ungated shared
// experts into the routed ones, one Experts call instead of three ops.
type SharedExperts interface {
	FoldsSharedExperts() bool
}

// Expert is one routed expert's SwiGLU weights, fused (GateUp) or separate.
type Expert struct {
	GateUp *Mat // (2·inter, hidden): rows [0, inter) gate, [inter, 2·inter) up; nil if separate
	Gate   *Mat // (inter, hidden); nil if fused
	Up     *Mat // (inter, hidden); nil if fused
	Down   *Mat // (hidden, inter)
	Shared bool // a shared expert folded in (Router.Shared): every token of a call takes it
}

// MoEOps route tokens to experts and run them.
type MoEOps interface {
	// Route sets ids and w (N, r.Width()), I32 and F32, from the router
	// logits (N, experts) F32.
	Route(ids, w, logits Tensor, r *Router)

	// Experts sets dst (N, hidden) = Σ_k w[i,k]·Expert_{ids[i,k]}(x[i]) for
	// x (N, hidden), summing a token's experts in increasing expert id so
	// the result does not depend on the other tokens of the batch. Each
	// expert's weights are read once per call.
	Experts(dst, x, ids, w Tensor, experts []Expert)
}

// MLAForm selects how AttentionMLA evaluates multi-head latent attention.
// Both forms compute the same function up to float32 rounding; the choice
// is a hint about cost, never about results.
type MLAForm uint8

const (
	// MLAAuto lets the backend pick per sequence (the CPU compares the
	// multiply-adds of both forms for the sequence's rows and context).
	MLAAuto MLAForm = iota
	// MLANaive expands the cached latents into per-head keys [W_UK·c | k_pe]
	// and values W_UV·c (cheap when many queries share the keys: prefill).
	MLANaive
	// MLAAbsorbed folds W_UK into the query and W_UV into the output and
	// scores the latents directly (cheap for few queries: decode).
	MLAAbsorbed
)

// MLAShape is a multi-head latent attention layer (DeepSeek-V2/V3,
// GLM-4.7-Flash). A query head is [q_nope (Nope) | q_pe (Rope)]; a cache
// row is [c (KVLora) | k_pe (Rope)]: the normed latent and the rotated key
// shared by all heads. kv_b_proj, (Heads·(Nope+V), KVLora), holds per head
// W_UK (Nope rows) then W_UV (V rows).
type MLAShape struct {
	Heads  int
	Nope   int     // qk_nope_head_dim
	Rope   int     // qk_rope_head_dim (even; 0 for NoPE MLA)
	V      int     // v_head_dim
	KVLora int     // kv_lora_rank
	Scale  float32 // softmax scale
	Form   MLAForm
}

// MLAOps are multi-head latent attention over a paged cache of latents. A
// backend that has them implements this interface next to Device; a model
// discovers it by type assertion.
type MLAOps interface {
	// StoreLatent writes, for every row of kv (N, KVLora+Rope) F32 (the
	// kv_a_proj_with_mqa output [c̃ | k]), the cache row
	// [RMSNorm(c̃)·norm | RoPE(k)] into cache (slots, KVLora+Rope), F32 or
	// BF16 (rounded to nearest even), at p.Slot. norm is (1, KVLora) F32
	// (eps as given); k is rotated at p.Pos by r (r.Dim = Rope, Rope =
	// kv.Cols − norm.Cols; r is nil when Rope is 0). kv is not modified.
	StoreLatent(cache, kv, norm Tensor, eps float32, r *Rotary, p *Paged)

	// AttentionMLA sets out (N, Heads·V) to each row's attention over its
	// sequence's cached positions [0, Pos[i]] — or, when sel is valid, only
	// over the positions in its row of sel (N, k) I32 (distinct and
	// ascending, then −1 for none: the DSA and k-pool selections; the GPU
	// reads no further than Pos[i]+1 entries) — with
	// softmax(Scale·(q_nope·W_UK·c + q_pe·k_pe)) weights on the values
	// W_UV·c. q is (N, Heads·(Nope+Rope)) F32; the last Rope dims of every
	// head are first rotated in place at p.Pos by r (so q is also written;
	// r is nil when Rope is 0). kvB is kv_b_proj. The step's own latents
	// must be stored first. A selection need not contain the row's own
	// position; a row that attends to nothing gets zeros.
	AttentionMLA(out, q, cache Tensor, kvB *Mat, r *Rotary, p *Paged, s MLAShape, sel Tensor)
}

// IndexerShape is a DeepSeek sparse attention (DSA) lightning indexer:
// Heads query heads of Dim dims against one cached key of Dim dims per
// position.
type IndexerShape struct {
	Heads, Dim int
	// Scale multiplies q·k inside the ReLU: Dim^-½, times Heads^-½ when
	// the head weights' own Heads^-½ factor is folded in (it is positive,
	// so it commutes with the ReLU).
	Scale float32
	// TopK is the selection size: rows with Pos+1 ≤ TopK keep every
	// position, so their scores are not computed (set to 0).
	TopK int
}

// SparseOps are the DSA pieces: the indexer's key cache, its scores and a
// top-k selection that AttentionMLA consumes. Discovered by type assertion
// like MLAOps.
type SparseOps interface {
	// StoreIndexKey writes, for every row of k (N, Dim) F32 (the wk
	// output), the cache row RoPE(LayerNorm(k)·w + b) into cache (slots,
	// Dim), F32 or BF16, at p.Slot. w and b are (1, Dim) F32; the
	// LayerNorm's mean and variance are float64 sums; r rotates the first
	// r.Dim dims at p.Pos (nil: no rotation).
	StoreIndexKey(cache, k, w, b Tensor, eps float32, r *Rotary, p *Paged)

	// IndexerScores sets scores (N, L) F32, L ≥ max(Pos)+1, to
	// I[i,t] = Σ_h w[i,h]·ReLU(Scale·q[i,h]·key_t) over the cached keys of
	// row i's sequence for t ≤ Pos[i], and −∞ for t > Pos[i]. q is
	// (N, Heads·Dim), w (N, Heads), both F32; keys is the key cache
	// (slots, Dim). Rows with Pos+1 ≤ s.TopK get 0 for every visible t.
	IndexerScores(scores, q, w, keys Tensor, p *Paged, s IndexerShape)

	// TopK sets sel (N, k) I32 to the columns of each row's k largest
	// scores (N, L) F32, ties to the lower column, never a −∞ one, in
	// ascending column order, then −1 where a row has fewer than k.
	TopK(sel, scores Tensor)

	// ReadI32 copies t (I32, len(dst) = t.Elems()) into host memory,
	// outside a step, like Memory.ReadF32: selections for tests and
	// inspection.
	ReadI32(dst []int32, t Tensor)
}

// Recurrent maps the sequences of a step to their recurrent-state slots
// (linear attention). Rows of one sequence are consecutive and in position
// order; a state tensor holds one slot per row, and Slot names the row each
// sequence continues from and leaves its state in. Distinct sequences have
// distinct slots.
//
// Record, when valid, also keeps the state after chosen rows: row i's entry
// ≥ 0 names a slot that receives the sequence's state as it is after row i
// (−1: none), so that speculative verification can roll back to any
// accepted row without running the rows again (engine/runtime). Only a
// sequence of at most RecordMaxRows rows may record (the token-by-token
// form, whose state after each row is the one plain decoding reaches);
// record slots are distinct from each other and from every Slot. A backend
// whose linear-attention ops honour Record says so with StateRecorder.
type Recurrent struct {
	Start  Tensor // (seqs+1, 1) I32 first row of each sequence; Start[0] = 0, Start[seqs] = N
	Slot   Tensor // (seqs, 1) I32 state slot of each sequence
	Record Tensor // (N, 1) I32 slot receiving the state after each row, or −1; zero Tensor for none
}

// RecordMaxRows is the most rows a sequence may have when it records
// states (Recurrent.Record): DeltaRule's token-by-token form.
const RecordMaxRows = 8

// StateRecorder is implemented by a backend whose LinearAttentionOps honour
// Recurrent.Record; RecordsStates reports whether they do.
type StateRecorder interface {
	RecordsStates() bool
}

// RowExact is implemented by a backend that can give each row of its
// linear ops (Linear, LinearCat, SwiGLULinear, NormLinearCat,
// AddNormLinearCat, NormSwiGLULinear) the bits a call with that row alone
// gives, whatever
// the other rows of the call: a speculative verification's rows then
// reproduce plain decoding's results bit for bit.
// SetRowExact turns that on or off for the steps that follow (outside a
// step); it may cost speed on many rows.
type RowExact interface {
	SetRowExact(on bool)
}

// SetRowExact calls be.SetRowExact(on) when be is a RowExact and reports
// whether it is.
func SetRowExact(be any, on bool) bool {
	r, ok := be.(RowExact)
	if ok {
		r.SetRowExact(on)
	}
	return ok
}

// RecordsStates reports whether be honours Recurrent.Record.
func RecordsStates(be any) bool {
	r, ok := be.(StateRecorder)
	return ok && r.RecordsStates()
}

// DeltaNet is one gated-delta-rule layer as the ops see it: Gated DeltaNet
// (Qwen3-Next: one decay per value head) or Kimi Delta Attention (KDA,
// glm5_next: one decay per key channel). Value head h reads q/k head
// h/(Heads/KeyHeads) (repeat_interleave GQA).
//
// The gates are computed in the op from the raw projections a and b, in
// float64 and rounded to float32 as the references do:
//
//	β = sigmoid(b)                                         (N, Heads)
//	x = float32(a + DtBias)                                (N, Heads) or, PerChannel, (N, Heads·DK)
//	g = −e^{ALog[h]}·softplus(x)                           LowerBound = 0 (GDN, Kimi-Linear)
//	g = LowerBound·sigmoid(e^{ALog[h]}·x)                  LowerBound < 0 (GLM-5.3-Flash KDA)
//
// softplus is torch's (threshold 20).
type DeltaNet struct {
	Heads, KeyHeads int // value (state) heads Hv and q/k heads Hk; Heads%KeyHeads == 0
	DK, DV          int // key and value head sizes

	PerChannel bool    // KDA: a and DtBias have one value per key channel
	ALog       Tensor  // (1, Heads) F32 A_log
	DtBias     Tensor  // (1, Heads), or (1, Heads·DK) PerChannel, F32 dt_bias
	LowerBound float32 // ≤ 0; see above
}

// QKVWidth is the width of the rule's [q | k | v] input,
// 2·KeyHeads·DK + Heads·DV.
func (n *DeltaNet) QKVWidth() int { return 2*n.KeyHeads*n.DK + n.Heads*n.DV }

// StateWidth is the width of one slot of the rule's state tensor,
// Heads·DK·DV: per head S (DK, DV), key index first.
func (n *DeltaNet) StateWidth() int { return n.Heads * n.DK * n.DV }

// Gate selects the output gate of GatedRMSNorm.
type Gate uint8

const (
	GateSiLU    Gate = iota // z·sigmoid(z): Gated DeltaNet
	GateSigmoid             // sigmoid(z): KDA
)

// LinearAttentionOps are the linear-attention layers of the hybrid models
// (Gated DeltaNet, KDA): a short convolution and the gated delta rule, each
// continuing from and updating every sequence's recurrent state, and the
// gated output norm. State tensors are F32, one slot per row, allocated
// with Alloc; a slot is snapshotted or restored with Copy of its row.
type LinearAttentionOps interface {
	// ShortConv sets dst (N, C) = silu(conv(x)) for x (N, C) F32: the
	// causal depthwise convolution with weights w (C, K) F32 (tap K−1
	// multiplies the current row), run over each sequence's rows after the
	// K−1 inputs in its slot of state (slots, (K−1)·C): row i of a slot is
	// the raw input K−1−i rows before the sequence's next one, oldest first
	// (zeros for a new sequence). It leaves there the sequence's last K−1
	// raw inputs. Sums are float64. dst may be x.
	ShortConv(dst, x, w, state Tensor, r *Recurrent)

	// DeltaRule sets out (N, Heads·DV) to the gated delta rule over each
	// sequence's rows, continuing from its slot of state (slots,
	// StateWidth()) and leaving there the state after its last row. qkv
	// (N, QKVWidth()) is the convolution's output [q | k | v]; the op
	// L2-normalises every q and k head (x/sqrt(Σx² + 1e-6), q then times
	// DK^-½, rounded to float32) and computes the gates from a and b (N,
	// Heads) (see DeltaNet). Per value head, for each row:
	//
	//	S ← diag(e^g)·S;  δ = β(v − Sᵀk);  S ← S + k·δᵀ;  o = Sᵀq
	//
	// A backend runs it token by token (decode, short chunks) or in the
	// chunked WY form (prefill), in float64; the two agree to rounding. A
	// sequence of at most 8 rows must take the token-by-token form, which
	// rounds the state to float32 after every row: speculative verification
	// then reproduces plain decoding bit for bit (engine/runtime).
	DeltaRule(out, qkv, a, b, state Tensor, r *Recurrent, n *DeltaNet)

	// GatedRMSNorm sets dst (R, D) = w ⊙ rmsnorm(x) ⊙ gate(z) for x, z
	// (R, D) and w (1, D) F32 (a plain weight, not 1 + w); rmsnorm(x) =
	// x/sqrt(mean(x²) + eps), float64, rounded once. A per-head norm
	// reshapes (N, heads·D) to (N·heads, D). dst may be x or z.
	GatedRMSNorm(dst, x, z, w Tensor, eps float32, gate Gate)

	// SigmoidGate sets dst (N, C) = x ⊙ sigmoid(gate), or adds it to dst
	// when accumulate, for x (N, C) and gate (N, C) or (N, 1) (one gate per
	// row) F32: Qwen3-Next's gated attention output and its MoE's gated
	// shared expert. dst may be x.
	SigmoidGate(dst, x, gate Tensor, accumulate bool)
}

// Hyper is one manifold-constrained hyper-connection site (mHC): the
// parameters that turn a token's hc residual streams into the sublayer's
// input and mix the sublayer's output back in. With M = (2+hc)·hc:
//
//	r    = rsqrt(mean(X²) + NormEps) over the token's hc·hidden stream values
//	mix  = (X·r)·Fnᵀ                                            (M)
//	pre  = sigmoid(mix[0:hc]·Scale[0] + Base[0:hc]) + Eps
//	post = 2·sigmoid(mix[hc:2hc]·Scale[1] + Base[hc:2hc])
//	comb = Sinkhorn(mix[2hc:]·Scale[2] + Base[2hc:])             (hc, hc), row i = source stream
//
// Sinkhorn is a row softmax plus Eps, a column normalisation, then Iters−1
// rounds of row and column normalisations, each dividing by (sum + Eps).
type Hyper struct {
	Fn      *Mat       // (M, hc·hidden) hc_*_fn
	Base    Tensor     // (1, M) F32 hc_*_base
	Scale   [3]float32 // hc_*_scale: pre, post, comb
	Streams int        // hc (hc_mult)
	Iters   int        // hc_sinkhorn_iters ≥ 1
	Eps     float32    // hc_eps
	NormEps float32    // eps of the weightless RMSNorm over the streams
}

// HyperOps are manifold-constrained hyper-connections (mHC, glm5next): a
// token's residual is hc streams X (hc·hidden, stream-major), collapsed
// before each sublayer and updated after it. Computed in float32 with
// float64 sums; the mix product is a matrix product in the weight's dtype.
type HyperOps interface {
	// HyperPre sets x (N, hidden) = Σ_i pre_i·X_i for the streams (N,
	// hc·hidden) and coef (N, hc+hc·hc) = [post | comb] (comb row-major,
	// row i = source stream), as Hyper describes.
	HyperPre(x, coef, streams Tensor, h *Hyper)
	// HyperPost sets, in place, X[j] = post[j]·y + Σ_i comb[i][j]·X[i] for
	// the streams (N, hc·hidden), the sublayer output y (N, hidden) and
	// HyperPre's coef.
	HyperPost(streams, y, coef Tensor)
	// HyperMerge sets dst (N, hidden) to the unweighted mean of the hc
	// streams (N, hc·hidden), summed in float64.
	HyperMerge(dst, streams Tensor)
}

// ClampOps are SwiGLU with an activation clamp (GLM-5's swiglu_limit L):
// silu(min(gate, L))·clamp(up, −L, L), L > 0. The unclamped SwiGLU and
// Experts of LinearOps and MoEOps are these without the clamp.
type ClampOps interface {
	// SwiGLUClamp is LinearOps.SwiGLU with the clamp. dst may be gate.
	SwiGLUClamp(dst, gate, up Tensor, limit float32)
	// ExpertsClamp is MoEOps.Experts with every expert's SwiGLU clamped.
	ExpertsClamp(dst, x, ids, w Tensor, experts []Expert, limit float32)
}

// KPool is glm5_next's k-pool DSA indexer (index_kpool). Every token t
// caches its indexer key k_t = LayerNorm(wk x_t) (weight NormW, bias NormB,
// NormEps) and gate γ_t = x_t·gateᵀ as the row [k_t | γ_t] (2·Dim) of a
// cache layer. Pools are Size
// consecutive tokens from position 0; the key of complete pool P is, per
// channel c,
//
//	K̄_P[c] = Σ_j softmax_j(γ_{P·Size+j}[c] + Ape[j][c])·k_{P·Size+j}[c]
//
// and is kept in the first Dim values of the pool's last token's row once
// that token is stored (its raw k_t is not needed any more: the tail pool
// is always incomplete). A query at position t scores the complete pools
// ending at or before t,
//
//	I_P = Σ_h w_h·ReLU(Scale·q_h·K̄_P)
//
// keeps the best min(Keep, #candidates) (ties to the lower pool) and, with
// Tail, the incomplete pool's tokens [t+1 − (t+1) mod Size, t] unscored.
type KPool struct {
	Size  int     // index_kpool tokens per pool
	Dim   int     // index_head_dim
	Heads int     // index_n_heads
	Keep  int     // complete pools kept per query: index_topk / index_kpool
	Tail  bool    // index_kpool_always_select_tail
	Ape   Tensor  // (Size, Dim) F32 index_kpool_compress_ape
	Scale float32 // Dim^-½, times Heads^-½ when the head weights' factor is folded in

	NormW, NormB Tensor  // (1, Dim) F32 k_norm weight and bias
	NormEps      float32 // k_norm eps
}

// SelWidth is the width of KPoolSelect's selection: the tokens of Keep
// pools, and Size−1 more with Tail.
func (k *KPool) SelWidth() int {
	if k.Tail {
		return k.Keep*k.Size + k.Size - 1
	}
	return k.Keep * k.Size
}

// KPoolOps are the k-pool indexer's cache and selection (glm5_next);
// the selection feeds MLAOps.AttentionMLA.
type KPoolOps interface {
	// StoreKPool writes each row's [LayerNorm(k) | g], k (the wk output)
	// and g (N, Dim) F32, into cache (slots, 2·Dim), F32 or BF16 (rounded
	// to nearest even), at p.Slot (the LayerNorm as ref.LayerNorm); then every row whose position closes a pool (Pos mod Size =
	// Size−1) replaces the first Dim values of its slot with the pool's key,
	// computed in float64 from the cached (rounded) members.
	StoreKPool(cache, k, g Tensor, p *Paged, kp *KPool)

	// KPoolSelect sets sel (N, SelWidth()) I32 to the positions each row
	// attends to: the tokens of its kept pools, then the tail's, increasing,
	// then −1. q is (N, Heads·Dim) and w (N, Heads) F32; the scores are
	// float64 sums. The step's rows must be stored first.
	KPoolSelect(sel, q, w, cache Tensor, p *Paged, kp *KPool)
}

// SampleOps reduce logit rows on the device, so that a step returns a few
// candidates per row instead of the vocabulary (engine/runtime samples from
// them; engine/sample says when they suffice). Discovered by type assertion
// like MLAOps.
type SampleOps interface {
	// TopKRows sets out (R, 2k) F32, 1 ≤ k ≤ V, to the k best entries of
	// each row of logits (R, V) F32, best first: the larger value first,
	// ties to the lower column, NaN counted as −∞ and −0 as +0. Row i of
	// out is [values (k) | columns (k)]: the values as ordered (NaN written
	// as −∞, −0 as +0), the columns as float32 (exact: V ≤ 2^24). With
	// k = 1 it is the greedy argmax.
	TopKRows(out, logits Tensor)
}

// DraftOps let one pass of a step feed its greedy choices into the token
// ids of a later pass of the same step, on the device: speculative
// decoding's MTP draft passes and their verification then run as one step,
// without a round trip to the host between them. Discovered by type
// assertion like SampleOps.
type DraftOps interface {
	// FeedIDs sets dst[i] to the integer value of element idx[i] of src
	// for every i with idx[i] ≥ 0 and leaves dst[i] alone where idx[i] < 0:
	// dst (M, 1) I32; idx (M, 1) I32, each a flat index r·Cols + c into
	// src (R, Cols) F32, contiguous, whose elements there are exact
	// integers (the columns of TopKRows's output). An index at or past
	// R·Cols leaves dst[i] alone too.
	FeedIDs(dst, src, idx Tensor)
}
