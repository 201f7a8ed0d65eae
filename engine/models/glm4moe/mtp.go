package glm4moe

import (
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/models/mla"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// mtpModel is a GLM-4.5 decoder with its NextN layer: a full GQA + MoE
// block at cache layer num_hidden_layers between the DeepSeek-style
// prologue (enorm, hnorm, eh_proj) and shared_head.
type mtpModel struct {
	*model.Decoder
	mtp *mla.NextN
}

// ForwardMTP implements model.MTPModel.
func (m *mtpModel) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	return m.mtp.Forward(m.Decoder, b, hidden)
}

// newModel assembles the decoder and, when the config declares a NextN
// layer and the checkpoint holds it, loads it with block and appends its
// cache layer (the same GQA width) to the layout.
func newModel(cfg *config.Config, l *nn.Loader, p transformer.Params, layers []model.Layer, block func(int) *nn.Block, be kernels.Backend) (model.Model, error) {
	d, err := transformer.NewDecoder(l, p, "glm4_moe", layers, be)
	if err != nil {
		return nil, err
	}
	nextn := cfg.IntOr("num_nextn_predict_layers", 0)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	if !mla.HasNextN(l, nextn, p.Layers) {
		return d, nil
	}
	mtp := mla.LoadNextN(l, p.Layers, p.Hidden, p.Eps, block(p.Layers), d.LMHead)
	if err := l.Err(); err != nil {
		return nil, err
	}
	d.Layout = append(d.Layout, d.Layout[0])
	return &mtpModel{Decoder: d, mtp: mtp}, nil
}
