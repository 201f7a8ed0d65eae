// Package linattn holds the pool of fixed-size per-sequence recurrent-state
// slots of ferrite's hybrid models ([StatePool]: host slices, or rows of
// backend tensors with [NewDeviceStatePool]), and the host-slice
// linear-attention mixers that glm5_next still runs on until it moves to
// the op set: the gated delta rule of Kimi Delta Attention (KDA, one
// log-decay per key channel; the GDN form, one scalar log-decay per head, is
// also here), the causal depthwise short convolution with its rolling state,
// the L2 normalisation of q and k, the decay gates and the gated RMSNorm on
// the output. Qwen3-Next runs on the op set: kernels.LinearAttentionOps,
// whose references (kernels/ref) and CPU kernels (kernels/cpu) these loops
// became.
//
// # The rule
//
// Per value head the state S is a [DK, DV] float32 matrix (key index first,
// as in Hugging Face transformers). For each token, with q and k already
// L2-normalised (q also scaled by DK^-½), v, β and the log-decay g ≤ 0
// (scalar for GDN, a [DK] vector for KDA):
//
//	S ← diag(e^g) S
//	δ = β (v − Sᵀk)
//	S ← S + k δᵀ
//	o = Sᵀq
//
// [DeltaRule.Recurrent] evaluates this token by token (decode, speculative
// verification, and the reference); [DeltaRule.Chunked] evaluates the same
// thing chunk by chunk in the WY/UT form (prefill). Both continue from the
// state passed in and leave the final state there, so a prompt may be fed in
// any number of calls of either kind. Both compute in float64 internally and
// store float32; the chunk form keeps every exponent ≤ 0 (decays are built as
// running products inside the lower triangle only), so strong decays cannot
// overflow; underflow is flushed to zero.
//
// # Layouts
//
// Activations are row-major float32 slices with one row per token. Shapes
// are written [a, b, c] with the last index fastest. q and k hold KeyHeads
// heads and v holds Heads heads per token; value head h reads key head
// h/(Heads/KeyHeads), Hugging Face's repeat_interleave GQA expansion, so q/k
// are never copied out per value head. Rows may have a stride larger than
// their width, so q, k and v can be read in place from the convolution
// output [T, 2·KeyHeads·DK + Heads·DV].
//
// # Choosing a form
//
// [DeltaRule.Forward] runs Recurrent for up to 8 tokens and Chunked beyond.
// On a CPU the two cost about the same per token for long prompts (both are
// dominated by ~3·DK·DV multiply-adds per token and head); the chunk form's
// O(C²) part grows with the chunk size, so Chunk = 16 or 32 is some 15–25 %
// faster than the default 64 here, with the same results up to rounding.
//
// # Other pieces
//
// [Conv] is the depthwise causal convolution (state: the last K−1 raw
// inputs). [L2Norm] normalises q/k; [KDAGates] turns the projection into
// g; [GatedRMSNorm] is the output norm. [StatePool]
// owns the per-sequence S and conv states of every linear layer, with
// snapshots for speculative rollback and slot copies for prefix reuse.
//
// # Parallelism
//
// Work is spread over heads (delta rule) or channel blocks (convolution) by
// a [ParallelFunc]; kernels.Backend.Parallel has that signature, so
// pass backend.Parallel. nil runs on the calling goroutine.
package linattn
