// Package model defines what an architecture provides to the engine and how
// the engine drives it: the Model interface, the Batch a forward pass runs,
// the registry of architectures, NewCache and NewStatePool. Every
// architecture runs on the op set (a DeviceModel): the GQA ones, the mla
// family and qwen3_next through engine/gqa's Decoder, glm5_next through its
// own layer loop around gqa's pieces.
//
// A forward pass runs one Batch: any mix of sequences, each contributing a
// chunk of prompt tokens, one decode token or k+1 speculative verify tokens,
// each at its own start position with its own paged-cache handle. All tokens
// of all sequences are flattened into one activation matrix (N, hidden), so
// every matrix product is batched across sequences; attention runs per
// sequence over its block table. Per sequence the caller chooses which rows
// produce logits (none, last, all) and whether the final hidden states are
// returned (for MTP drafting).
//
// Architectures live in engine/models/<arch> and register a Constructor
// under their config.json model_type in init(); engine/models/all imports
// them all. Constructors read every dimension from the config and every
// weight through a WeightSource, so the same code builds a model from a
// checkpoint (*weights.Set) or from random tensors (randweights.Source).
package model
