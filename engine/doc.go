// Package engine is ferrite's inference engine: it loads a Hugging Face
// checkpoint (config.json + safetensors + tokenizer.json), runs batched
// forward passes over a paged KV cache and per-sequence recurrent state, and
// samples tokens. Sub-packages hold the pieces: weights loading, the KV cache,
// the samplers, shared neural-network layers and one package per architecture.
//
// Load is the entry point: it reads config.json, memory-maps the weights
// (or invents random ones), starts the CPU backend and builds the model
// registered for the config's model_type. The caller loads the tokenizer
// with tokenizer.Load(dir).
//
// Package map:
//
//	config       config.json reader (typed getters that record missing keys)
//	weights      memory-mapped safetensors; shape-checked kernels.Mat views
//	kvcache      paged, reference-counted K/V cache (Reserve/Truncate/Fork/Free)
//	model        Model, Batch, Output, the registry, and Decoder (the shared
//	             decoder-only transformer)
//	nn           layers: Linear, RMSNorm, RoPE, paged GQA attention, SwiGLU MLP, MoE
//	models/<arch> one package per architecture, registered in init
//	models/all   blank imports of every architecture
//	randweights  seeded random tensors for any config (benchmarks, tests)
//	sample       samplers
//	runtime      the continuous-batching scheduler
//
// Numerics: weights stay in their stored dtype and are widened inside the
// matrix kernels; activations, norms, softmax, router scores and the KV
// cache are float32. Against transformers' float32 references the logits
// agree to about 1e-6 of their largest magnitude (fixture_test.go).
package engine
