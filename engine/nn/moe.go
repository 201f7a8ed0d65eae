package nn

import "github.com/ferrite-llm/ferrite/kernels"

// Scoring is how a router turns logits into expert scores (see
// kernels.Scoring).
type Scoring = kernels.Scoring

// The scorings, as in package kernels.
const (
	SoftmaxScoring = kernels.SoftmaxScoring
	SigmoidScoring = kernels.SigmoidScoring
)

// Router picks TopK experts per token and their weights from the logits
// x·Wᵀ, as kernels.Router describes (grouped top-k masks the groups left
// out with −inf, as DeepSeek's reference does; Hugging Face fills 0, which
// differs only when biased scores are negative).
type Router struct {
	W          *kernels.Mat // (experts, hidden)
	Bias       []float32    // (experts) e_score_correction_bias, selection only; nil if none
	Scoring    Scoring
	TopK       int
	NormTopK   bool
	Scale      float32 // routed_scaling_factor; 1 for none
	Groups     int     // n_group; ≤ 1 disables grouped selection
	TopKGroups int     // topk_group
}

// Expert is one routed expert's SwiGLU weights, stored either fused
// (GateUp) or as separate Gate and Up matrices.
type Expert = kernels.Expert

// MoE is a routed mixture of SwiGLU experts with optional shared experts:
// y = Σ_k w_k·Expert_k(x) + g·Shared(x), where g = sigmoid(x·SharedGateᵀ)
// for Qwen-style gated shared experts and 1 otherwise (weights as loaded;
// gqa.MoE runs it).
type MoE struct {
	Router     Router
	Experts    []Expert // (experts)
	Shared     *MLP     // shared experts (DeepSeek/GLM n_shared_experts fused into one MLP); nil if none
	SharedGate *Linear  // (1, hidden) Qwen-style sigmoid gate on Shared; nil if ungated
}
