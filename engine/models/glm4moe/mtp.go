package glm4moe

import (
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// newModel assembles the decoder on the op set and, when the config
// declares a NextN layer and the checkpoint holds it, loads it with block
// (a full GQA + MoE block at cache layer num_hidden_layers between the
// DeepSeek-style prologue — enorm, hnorm, eh_proj — and shared_head) and
// returns a gqa.MTPDecoder.
func newModel(cfg *config.Config, l *nn.Loader, p transformer.Params, layers []*nn.Block, block func(int) *nn.Block, be kernels.Backend) (model.Model, error) {
	d, err := transformer.NewModel(l, p, "glm4_moe", layers, be)
	if err != nil {
		return nil, err
	}
	nextn := cfg.IntOr("num_nextn_predict_layers", 0)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	if !gqa.HasNextN(l, nextn, p.Layers) {
		return d, nil
	}
	u := gqa.NewUploader(d.Dev)
	blk := u.Block(block(p.Layers))
	h, err := gqa.LoadNextN(l, u, p.Layers, p.Hidden, p.Eps, blk, d.LMHead)
	if err != nil {
		return nil, err
	}
	return d.WithNextN(h, p.Layout()[0])
}
