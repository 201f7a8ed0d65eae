// Package mixtral implements Mixtral (model_type "mixtral"): Llama-style
// GQA attention and a sparse MoE FFN in every layer — softmax router,
// top num_experts_per_tok (2), renormalised. Experts are read from
// Transformers 4 names (block_sparse_moe.experts.{e}.w1/w3/w2) or
// Transformers 5 names (mlp.experts, fused or per expert).
package mixtral

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("mixtral", New) }

// New builds a Mixtral model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := transformer.Read(cfg, false)
	if err != nil {
		return nil, err
	}
	experts := cfg.Int("num_local_experts")
	topK := cfg.Int("num_experts_per_tok")
	window := cfg.IntOr("sliding_window", 0)
	transformer.RequireInter(cfg, p)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	switch {
	case experts <= 0 || topK <= 0 || topK > experts:
		return nil, fmt.Errorf("bad MoE shape: num_local_experts %d, num_experts_per_tok %d", experts, topK)
	case window > 0 && window < p.MaxContext:
		return nil, fmt.Errorf("sliding_window %d: sliding-window attention is not supported", window)
	}
	// Transformers 4 checkpoints call the block block_sparse_moe and the
	// projections w1 (gate), w3 (up), w2 (down).
	pre, names := "mlp", nn.HFNames
	if w.Has("model.layers.0.block_sparse_moe.gate.weight") {
		pre, names = "block_sparse_moe", nn.MixtralNames
	}
	moe := func(l *nn.Loader, i int) nn.FFN {
		return l.SoftmaxMoE(fmt.Sprintf("model.layers.%d.%s", i, pre), names, experts, topK, true, p.Hidden, p.Inter)
	}
	return transformer.Build(w, p, "mixtral", transformer.AttnOptions{}, moe, be)
}
