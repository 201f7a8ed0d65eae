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
// one GEMV each over weights stacked once on the device (the SwiGLU in the
// GEMV's epilogue), o and down add to the residual in theirs, PrepareQKV
// norms, rotates and stores q/k/v in one kernel, and the split-KV
// attention kernel asks L2 for a decode row's keys and values before its
// PDL wait (FERRITE_CUDA_ATTN_PREFETCH=0 turns that off). On sm_90 those
// kernels use programmatic dependent launch (pdl.go; FERRITE_CUDA_PDL=0
// turns it off). Off by default, as GPU runs 2 and 3 measured them
// slower: FERRITE_CUDA_FUSE=1 runs a decode row's PrepareQKV inside the
// attention kernel and merges the splits there (QKVAttention),
// FERRITE_CUDA_FUSE_NORM=1 fuses the layer norms into the GEMVs,
// FERRITE_CUDA_PREFETCH=1 makes the GEMVs prefetch their weights before
// the PDL wait. One-row decode kernels (decode.go, src/ops_decode.cu), on
// by default since GPU run 2 of session 14: a decode row's QKVAttention
// runs as ferrite_dattn (the keys in splits of 32 or more, 4 query heads
// of a KV group a block, the first tile of past keys and values copied
// into shared memory before the PDL wait, PrepareQKV inside, the last
// split merging; a row-exact verification's rows get the same bits), and
// one-row norms as ferrite_rmsnorm_row (FERRITE_CUDA_DATTN=0 or =1 (after
// PrepareQKV), FERRITE_CUDA_DATTN_G4=0, FERRITE_CUDA_DNORM=0 switch back);
// FERRITE_CUDA_DNORM=gemv also norms a one-row product's output in that
// GEMV's last block (ferrite_gemv_*_1n; measured slower, off).
// FERRITE_CUDA_GEMV_ROWS=4 or 8 picks the GEMV of
// that many rows a block. Decode batches of up to 256 rows (a row a
// sequence) run ferrite_dattn too, the rows copying their first tile
// before the PDL wait (FERRITE_CUDA_DATTN_BATCH=0: the split-KV kernel).
// FERRITE_CUDA_PROFILE=1 runs eagerly and times every kernel, GEMM,
// copy and memset with CUDA events into a per-kernel table;
// FERRITE_CUDA_PROFILE=graph times the kernels of replayed step graphs
// through event record nodes instead (profile.go, kernels.Profiler; ferrite
// bench prints the table after each case). FERRITE_CUDA_STEPTIME=1 (or ops)
// times each step's host parts and its graph's GPU time without changing
// how it runs (steptime.go). Decode batches (on by default since GPU run 3
// of session 15): the split products' epilogues run joined to the op after
// them (halves.go; FERRITE_CUDA_FUSE_HALVES=0 turns it off), EndStep's
// caller polls for the step's end rather than parking (device.go's
// stepSpinOn; FERRITE_CUDA_STEPSPIN=0), and a batch of one row a sequence
// skips the prefill attention kernel, which would own no tile
// (attnsplit.go; FERRITE_CUDA_DECODE_PREFILL=1 runs it as before). A MoE layer's
// experts are grouped GEMVs for up to 32 tokens (moe.go, src/ops_moe.cu: a
// slot a pass below 4 tokens, register tiles from 4), streamed through
// shared memory from 33 tokens up to 512 slots (moe_pipe.go), an ungated shared
// expert folded in (kernels.SharedExperts); bf16 experts of 16 to 256
// tokens with no shared expert folded in run on the tensor cores instead
// outside the row-exact mode (moe_tc.go, src/ops_moe_tc.cu;
// FERRITE_MOE_TC=N the most tokens, 0 none; FERRITE_MOE_TC_FROM=N the fewest); FERRITE_MOE_KERNELS=v1,
// FERRITE_MOE_FOLD=0 and the other FERRITE_MOE_* switches of moeConfig
// pick the earlier or other variants for comparison. One token runs
// persistent kernels of a block an SM instead (src/ops_moe_b1.cu: every
// chosen expert's gate/up rows over all of them, then the down rows, two
// launches, the second planning and loading before its PDL wait), with
// the bits of the kernels it replaces; FERRITE_MOE_B1=1 runs them as one
// launch with a grid barrier, =2 as two for 1 to 3 tokens, and =0 not at
// all.
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
// prompts are prefilled in large chunks. A step replays a CUDA graph from the second time
// its launches are seen among the recent steps' (speculation's alternating
// draft and verification shapes included), the last 32 shapes' graphs kept
// (graph.go); its small input uploads are queued with its launches and
// reach the device thread with them, in one hand-over. It also implements the host-slice kernels.Backend, copying
// activations for every MatMul, for the architectures not on the op set.
//
// With kernels.MLAOps and kernels.SparseOps (mla.go, src/ops_mla.cu) the
// MLA family runs on the op set too: latent and index-key stores, the
// absorbed latent attention with optional DSA selections, the indexer
// scores and a top-k with the references' tie order. With a BF16 cache of
// 512 latent and 64 rope dims (DeepSeek-V3, GLM-4.7-Flash, GLM-5) the
// latent attention runs on tensor cores (src/tensor_mla.cu: every head of
// a row shares each key tile in shared memory, the query and probabilities
// split into bf16 terms for float32 accuracy); FERRITE_MLA_TC=0 keeps the
// CUDA-core kernels.
//
// The linear-attention ops of a prompt (linattn.go): ShortConv runs every
// row at once (FERRITE_CUDA_CONV_ROWS=0 keeps the kernel that steps
// through each sequence's rows, as decode and verification steps do);
// DeltaRule's chunked WY form (src/ops_linattn_chunk.cu) is opt-in,
// FERRITE_CUDA_DELTA_CHUNK=1, as it measured slower than the row-by-row
// kernel.
//
// GGML-quantized weights (quant.go) keep their blocks on the device for the
// linear ops: src/ops_quant.cu's GEMV for up to 8 rows of x
// (FERRITE_CUDA_QGEMV_ROWS sets the limit), on x quantized to int8 with
// dp4a products (FERRITE_CUDA_QX8=0: on float32 x, where
// FERRITE_CUDA_QGEMV_R=2 or 8 sets the one-row form's weight rows a block,
// 4 by default), the tensor-core product over the blocks on that int8 x
// for decode batches up to 255 rows (ferrite_qmmq_*: mma.sync s8;
// FERRITE_CUDA_MMQ_ROWS sets the limit, 0 turns it off), and an exact
// decoding into bf16 scratch for wider products. Quantized MoE experts keep theirs
// for the grouped GEMVs, register tiles and CUDA-core tiles (the _q forms
// of src/ops_moe.cu's kernels); 9 to 255 tokens of experts whose gates and
// ups share a dtype and whose downs share one take the grouped tensor-core
// product on int8 x (ferrite_moe_mmq_*; FERRITE_CUDA_MOE_MMQ sets the
// limit, 0 turns it off), and a prefill of 256 tokens and more decodes the
// chosen experts into bf16 for the tensor cores. Embed gathers a quantized
// table's rows from its blocks.
// FERRITE_CUDA_QUANT=0 decodes them to float32 at load as before.
package cuda
