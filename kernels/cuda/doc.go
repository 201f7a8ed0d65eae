// Package cuda is ferrite's NVIDIA GPU backend. It binds the CUDA driver API
// (libcuda.so.1) and cuBLASLt at run time with github.com/ebitengine/purego,
// so builds stay CGO_ENABLED=0 and a binary runs unchanged on machines with
// no GPU: Open then returns an error and callers use the CPU.
//
// A Device owns one GPU: its primary context is current on one locked OS
// thread, a goroutine that runs every driver call in order. Device memory
// is a Buffer, freed explicitly (there are no finalizers); host copies go
// through fixed pinned staging buffers; kernel launch arguments live in a
// pinned block. Every failure is a Go error naming the CUresult (or the
// cuBLAS status); a sticky error such as an illegal address marks the
// Device dead, and every later call returns that error instead of crashing.
//
// A decode step is a few fused kernels a layer: q/k/v and gate/up run as
// one GEMV each over weights stacked once on the device (LinearCat,
// SwiGLULinear, the SwiGLU in the GEMV's epilogue), and PrepareQKV norms,
// rotates and stores q/k/v in one kernel. On sm_90 those kernels use
// programmatic dependent launch (pdl.go; FERRITE_CUDA_PDL=0 turns it off),
// and FERRITE_CUDA_GEMV_ROWS=4 or 8 picks the GEMV of that many rows a
// block. FERRITE_CUDA_PROFILE=1 runs eagerly and times every kernel, GEMM,
// copy and memset with CUDA events into a per-kernel table (profile.go,
// kernels.Profiler; ferrite bench prints it after each case).
//
// The kernels are CUDA C++ in src/, built by tools/cuda/build_fatbin.sh into
// ferrite.fatbin (sm_90a machine code plus compute_80 PTX), embedded and
// loaded with cuModuleLoadData; fatbin.sha256 pins the sources it was built
// from; tools/cuda/check_cuda.sh type-checks them with clang where there is
// no nvcc. Backend implements the op set (kernels.Device) and the
// linear-attention, k-pool, mHC and clamp capabilities
// (kernels.LinearAttentionOps, with kernels.Recurrent.Record for the
// speculative rollback, KPoolOps, HyperOps, ClampOps, and kernels.RowExact
// for verification steps) on a Device:
// tensors in device memory, a per-step scratch arena, launches queued and
// handed to the device thread in batches, each weight uploaded once per
// *kernels.Mat (a kernels.Mat.Random one without Data generated in device
// memory instead: the bytes engine/randweights makes on the host), and kernels.SampleOps (src/sample.cu: a row's argmax, or
// its best k by radix select). Attention runs a flash-attention kernel on
// tensor cores (src/prefill.cu) for tiles of prompt rows of one sequence and
// a split-KV kernel for the other rows (decode); PreferredBatchTokens asks
// the runtime for steps of up to 4,096 tokens (by the GPU's memory), so
// prompts are prefilled in large chunks. Steps that repeat replay CUDA graphs, the last eight shapes' kept
// (graph.go). It also implements the host-slice kernels.Backend, copying
// activations for every MatMul, for the architectures not on the op set.
//
// With kernels.MLAOps and kernels.SparseOps (mla.go, src/ops_mla.cu) the
// MLA family runs on the op set too: latent and index-key stores, the
// absorbed latent attention with optional DSA selections, the indexer
// scores and a top-k with the references' tie order.
package cuda
