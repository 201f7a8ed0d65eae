// Package weights loads the tensors of a Hugging Face checkpoint directory
// from its safetensors files.
//
// Open memory-maps every file of a checkpoint (one model.safetensors, the
// shards named by model.safetensors.index.json, or every *.safetensors in the
// directory) read-only and validates each header up front, so a corrupt or
// truncated download is reported as an error naming the file, the tensor and
// what was expected, never a panic later. Tensors stay in their stored dtype:
// a Tensor's Data and a kernels.Mat's Data are views into the mapping, and
// only small tensors (norms, biases, gates) are converted to []float32, by
// Float32.
//
// Set.Mat and Set.Expert hand the engine 2-D weight views. For float8
// (F8_E4M3) weights they attach the checkpoint's block scales, the
// "<name>_scale_inv" tensor (DeepSeek-V3 style "...weight_scale_inv"),
// inferring the block size from the scale shape.
//
// WriteFile, Encode, QuantizeF8, FromMemory and NewMem build checkpoints for
// tests and random-weight models, on disk or in memory.
//
// A Set is read-only after Open and safe for concurrent use; Close unmaps the
// files, after which no Data slice obtained from the Set may be touched.
package weights
