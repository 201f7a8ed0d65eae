package nn

// RMSNorm is an RMSNorm's weights as loaded: y = w ⊙ x·rsqrt(mean(x²) +
// eps), or (1 + w) ⊙ … in the zero-centred form (Qwen3-Next)
// (kernels.NormOps runs it).
type RMSNorm struct {
	W      []float32 // (dim)
	Eps    float32
	Offset bool // zero-centred: scale by 1 + W
}
