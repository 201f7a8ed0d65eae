// Package nn loads the engine's layers from a checkpoint into tiny host
// structs of weights: Linear, RMSNorm, RoPE (its inverse frequencies with
// every scaling), the GQA attention shape, the SwiGLU MLP and the
// mixture-of-experts router and experts, and the pre-norm Block that holds
// them. engine/gqa's Uploader converts them for the op set, which computes
// everything (kernels.Device; references in kernels/ref).
//
// Conventions:
//   - Weights are kernels.Mat views in their stored dtype, stored (out, in)
//     as in PyTorch, so a Linear computes y = x·Wᵀ (+ b).
//   - Small vectors (norm weights, biases, router biases) are float32.
//
// Loading goes through a Loader, which records every missing or misshapen
// tensor (naming it) instead of stopping at the first, so a model
// constructor builds everything and then checks Loader.Err once.
package nn
