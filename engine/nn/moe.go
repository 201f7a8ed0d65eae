package nn

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
)

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

// GroupedMoEShape is a DeepSeek-style (noaux_tc) MoE's shape as config.json
// gives it: n_routed_experts, num_experts_per_tok, moe_intermediate_size,
// n_shared_experts, n_group and topk_group.
type GroupedMoEShape struct {
	Experts, TopK, Inter, Shared, Groups, TopKGroups int
}

// Check returns an error naming the config keys when s cannot run: no
// experts, a top-k outside them, groups that do not divide them or leave
// fewer than two experts a group (the group score sums the top two).
func (s GroupedMoEShape) Check() error {
	switch {
	case s.Experts <= 0 || s.TopK <= 0 || s.TopK > s.Experts || s.Inter <= 0 || s.Shared < 0:
		return fmt.Errorf("bad MoE shape: n_routed_experts %d, num_experts_per_tok %d, moe_intermediate_size %d, n_shared_experts %d",
			s.Experts, s.TopK, s.Inter, s.Shared)
	case s.Groups <= 0 || s.Experts%s.Groups != 0 || s.TopKGroups <= 0 || s.TopKGroups > s.Groups || (s.Groups > 1 && s.Experts/s.Groups < 2):
		return fmt.Errorf("bad expert groups: n_group %d, topk_group %d for %d experts", s.Groups, s.TopKGroups, s.Experts)
	}
	return nil
}

// SoftmaxMoE loads a Mixtral/Qwen-style MoE block under prefix
// ("model.layers.3.mlp"): a softmax router prefix.gate.weight (experts,
// hidden) that picks topK experts, their weights renormalised when
// normTopK, and the routed experts under prefix.experts (names, inter
// wide). A shared expert, where there is one, is the caller's to add.
func (l *Loader) SoftmaxMoE(prefix string, names MLPNames, experts, topK int, normTopK bool, hidden, inter int) *MoE {
	return &MoE{
		Router: Router{
			W:        l.Mat(prefix+".gate.weight", experts, hidden), // (experts, hidden)
			Scoring:  SoftmaxScoring,
			TopK:     topK,
			NormTopK: normTopK,
			Scale:    1,
		},
		Experts: l.Experts(prefix+".experts", names, experts, hidden, inter),
	}
}

// GroupedMoE loads a DeepSeek-V3-style (noaux_tc) MoE block of shape s
// under prefix ("model.layers.3.mlp"): a sigmoid router prefix.gate.weight
// (s.Experts, hidden) with prefix.gate.e_score_correction_bias for the
// selection only, grouped top-k, the chosen weights renormalised when
// normTopK and times scale (routed_scaling_factor); the routed experts
// under prefix.experts; and s.Shared shared experts fused into one MLP,
// prefix.shared_experts (s.Inter·s.Shared wide), when s.Shared > 0.
func (l *Loader) GroupedMoE(prefix string, s GroupedMoEShape, hidden int, normTopK bool, scale float32) *MoE {
	moe := &MoE{
		Router: Router{
			W:          l.Mat(prefix+".gate.weight", s.Experts, hidden), // (experts, hidden)
			Bias:       l.Vec(prefix+".gate.e_score_correction_bias", s.Experts),
			Scoring:    SigmoidScoring,
			TopK:       s.TopK,
			NormTopK:   normTopK,
			Scale:      scale,
			Groups:     s.Groups,
			TopKGroups: s.TopKGroups,
		},
		Experts: l.Experts(prefix+".experts", HFNames, s.Experts, hidden, s.Inter),
	}
	if s.Shared > 0 {
		moe.Shared = l.MLP(prefix+".shared_experts", HFNames, hidden, s.Inter*s.Shared, false)
	}
	return moe
}
