// Package nn holds the engine's shared layers on host slices as tiny
// structs: Linear, RMSNorm, RoPE, causal GQA attention over the paged KV
// cache, the SwiGLU MLP and mixture-of-experts routing. The architectures not
// yet on the op set (qwen3_next, glm5_next) run them, with the heavy matrix
// products through kernels.Backend and the shared formulas from
// kernels/ref; the op-set architectures (GQA and the mla family) load their
// weights with nn's Loader and run on engine/gqa.
//
// Conventions:
//   - Activations are row-major float32 matrices passed as flat slices with
//     a row count n: x (n, in) means n rows of in values.
//   - Weights are kernels.Mat views in their stored dtype, stored (out, in)
//     as in PyTorch, so a Linear computes y = x·Wᵀ (+ b).
//   - Norms, softmax, router scores and RoPE tables are computed in fp32
//     (with float64 accumulators where a sum is long), matching the
//     reference implementation's upcasts.
//   - A flattened batch's rows map to sequences through a Tokens value;
//     attention runs per sequence over its block table.
//
// Loading goes through a Loader, which records every missing or misshapen
// tensor (naming it) instead of stopping at the first, so a model
// constructor builds everything and then checks Loader.Err once.
package nn
