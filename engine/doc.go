// Package engine is ferrite's inference engine: it loads a Hugging Face
// checkpoint (config.json + safetensors + tokenizer.json), runs batched
// forward passes over a paged KV cache and per-sequence recurrent state, and
// samples tokens. Sub-packages hold the pieces: weights loading, the KV cache,
// the samplers, shared neural-network layers and one package per architecture.
package engine
