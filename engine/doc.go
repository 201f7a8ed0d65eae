// Package engine is ferrite's inference engine: it loads a Hugging Face
// checkpoint (config.json + safetensors + tokenizer.json) or a GGUF file,
// optionally quantizing its matrices as they load, runs batched
// forward passes over a paged KV cache and per-sequence recurrent state, and
// samples tokens. Sub-packages hold the pieces: weights loading, the KV cache,
// the samplers, shared neural-network layers and one package per architecture.
//
// Load is the entry point: it reads config.json, memory-maps the weights
// (or invents random ones), starts the CPU backend and builds the model
// registered for the config's model_type; given a GGUF file it takes the
// config, weights and tokenizer from package gguf instead (load_gguf.go).
// Options.Quant turns the matrices into Q8_0 or Q4_K blocks as they load
// (quantize.go). The caller loads the tokenizer with LoadTokenizer. Load
// then has the backend prepare the weights (prepare.go: the CPU's copies
// and repacked matrices, which its first MatMuls would otherwise make) on a
// goroutine of its own; Loaded.Close stops that and waits for it.
//
// Package map:
//
//	config       config.json reader (typed getters that record missing keys)
//	weights      memory-mapped safetensors; shape-checked kernels.Mat views
//	gguf         GGUF files: validated reader, config, weights under HF names, tokenizer
//	kvcache      paged, reference-counted K/V cache (Reserve/Truncate/Fork/Free)
//	linattn      the hybrids' per-sequence recurrent-state slots (linear attention runs on the op set)
//	model        Model, Batch, Output, the registry, NewCache and NewStatePool
//	nn           layers' weights as loaded (Linear, RMSNorm, RoPE frequencies, MLP, MoE) and the Loader
//	models/<arch> one package per architecture, registered in init
//	models/all   blank imports of every architecture
//	randweights  seeded random tensors for any config (benchmarks, tests)
//	sample       samplers
//	runtime      the continuous-batching scheduler
//	bench        the throughput sweep of ferrite bench
//
// Numerics: weights stay in their stored dtype (or the GGML blocks
// Options.Quant made of them at load) and are widened inside the matrix
// kernels; activations, norms, softmax, router scores and the KV
// cache are float32. Against transformers' float32 references the logits
// agree to about 1e-6 of their largest magnitude (fixture_test.go).
package engine
