// Package linattn holds the pool of fixed-size per-sequence recurrent-state
// slots of ferrite's hybrid models (qwen3_next's Gated DeltaNet and
// glm5_next's Kimi Delta Attention layers): [StatePool], rows of backend
// tensors in the model's device memory (never host slices), with
// snapshots for speculative rollback and slot copies for prefix reuse. Each linear layer of a slot holds the delta
// rule's state S [Heads, DK, DV] (key index first) and the short
// convolution's last K−1 inputs ([LayerShape]). The layers' math is the op
// set's kernels.LinearAttentionOps (references in kernels/ref).
package linattn
