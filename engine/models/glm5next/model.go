package glm5next

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// arch is the model_type the model reports in Info.
const arch = "glm5_next"

func init() {
	// "glm5_next" is the vision-language wrapper's (and a flat config's)
	// model_type; engine/config takes the text model's "glm5_next_text" from
	// text_config when the config is nested.
	model.Register(arch, New)
	model.Register("glm5_next_text", New)
}

// device is the op set glm5_next runs on: the GQA family's Device plus
// NoPE MLA attention, the k-pool indexer, KDA's linear attention, the
// hyper-connections and the clamped SwiGLU.
type device interface {
	kernels.Device
	kernels.MLAOps
	kernels.KPoolOps
	kernels.LinearAttentionOps
	kernels.HyperOps
	kernels.ClampOps
}

// Model is a loaded GLM-5.3-Flash text model on the op set. It implements
// model.StateModel and model.DeviceModel; a model loaded with its MTP
// layer is wrapped in a type that also implements model.MTPModel.
type Model struct {
	p      params
	dev    device
	embed  *kernels.Mat         // (vocab, hidden) embed_tokens
	layers []*layer             // (num_hidden_layers)
	norm   *gqa.Norm            // (hidden) final norm, after the mean over streams
	lmHead *kernels.Mat         // (vocab, hidden); embed when tied
	mtp    *gqa.MTPDecoder      // the NextN layer on gqa's decoder; nil without it
	layout kvcache.Layout       // (layers [+1 MTP]) zero width for KDA layers; shared with mtp
	states []linattn.LayerShape // (KDA layers) one sequence's slot

	// trace, when set (tests), is called inside the step after each layer
	// with the residual streams (N, hc·hidden), and after each DSA layer
	// with its selection (N, SelWidth) I32.
	trace    func(layer int, streams kernels.Tensor)
	traceSel func(layer int, sel kernels.Tensor)

	mu      sync.Mutex   // one pass at a time
	in      gqa.Inputs   // the step's ids, row maps and state slots
	streams streamInputs // the step's token ids, once per stream
}

// withMTP is a Model with its NextN layer: the model.MTPModel and
// model.SpecModel implementation.
type withMTP struct{ *Model }

var _ model.SpecModel = withMTP{}

// layer is one decoder layer: two hyper-connection sites around the token
// mixer (KDA or DSA) and the FFN.
type layer struct {
	attnHC   *kernels.Hyper       // hc_attn_{fn,base,scale}
	attnNorm *gqa.Norm            // (hidden) input_layernorm
	kda      *gqa.LinearAttention // set on linear_attention layers (KDA)
	dsa      *dsa                 // set on deepseek_sparse_attention layers
	ffnHC    *kernels.Hyper       // hc_ffn_{fn,base,scale}
	ffnNorm  *gqa.Norm            // (hidden) post_attention_layernorm
	ffn      gqa.FFN              // *gqa.MLP (dense) or *gqa.MoE (sparse), clamped
}

// loader is what the constructors share: the checkpoint, the device and
// the hyperparameters.
type loader struct {
	*nn.Loader
	u   *gqa.Uploader
	dev device
	p   *params
}

// New builds a glm5_next model from a flat text config or the
// vision-language wrapper's text_config (engine/config merges it), with
// the text weights under "model.language_model." or "model.". The vision
// tower (model.visual.*) is not loaded. be must implement the op set
// glm5_next needs (the CPU and strict backends do).
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := readParams(cfg)
	if err != nil {
		return nil, err
	}
	dev, ok := be.(device)
	if !ok {
		return nil, &model.OpsError{Backend: be.Name(), Missing: "the op set glm5_next needs (kernels.Device with MLAOps, KPoolOps, LinearAttentionOps, HyperOps and ClampOps)"}
	}
	l := &loader{Loader: nn.NewLoader(w), u: gqa.NewUploader(dev), dev: dev, p: &p}
	root := "model."
	if l.Has("model.language_model.embed_tokens.weight") {
		root = "model.language_model."
	}
	m := &Model{p: p, dev: dev}
	var prev *dsa // the last DSA layer, whose selection a shared layer reuses
	for i := range p.layers {
		m.layers = append(m.layers, l.layer(m, fmt.Sprintf("%slayers.%d.", root, i), i, &prev))
	}
	m.embed = l.Mat(root+"embed_tokens.weight", p.vocab, p.hidden)
	m.norm = l.norm(root + "norm")
	m.lmHead = m.embed
	if !p.tied {
		m.lmHead = l.Mat("lm_head.weight", p.vocab, p.hidden)
	}
	m.layout = gqa.BF16Layout(m.layout)
	if mtpPre := fmt.Sprintf("%slayers.%d.", root, p.layers); p.nextn > 0 && l.Has(mtpPre+"eh_proj.weight") {
		m.mtp = l.mtp(mtpPre, m)
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	if err := l.u.Err(); err != nil {
		return nil, err
	}
	if m.mtp != nil {
		return withMTP{m}, nil
	}
	return m, nil
}

// layer loads decoder layer i under pre and adds its cache layer (and,
// for KDA, its state) to m's layouts; *prev is the last DSA layer, which a
// shared one reuses the selection of.
func (l *loader) layer(m *Model, pre string, i int, prev **dsa) *layer {
	p := l.p
	ly := &layer{
		attnHC:   l.hyper(pre + "hc_attn"),
		attnNorm: l.norm(pre + "input_layernorm"),
		ffnHC:    l.hyper(pre + "hc_ffn"),
		ffnNorm:  l.norm(pre + "post_attention_layernorm"),
	}
	if p.types[i] == linearAttention {
		ly.kda = l.kda(pre+"self_attn.", len(m.states))
		m.states = append(m.states, ly.kda.StateShape())
		m.layout = append(m.layout, kvcache.LayerWidth{})
	} else {
		own := p.idxTypes[i] == fullIndexer
		ly.dsa = l.dsa(pre+"self_attn.", i, own)
		width := kvcache.LayerWidth{K: p.kvLora}
		if own {
			width = kvcache.LayerWidth{K: p.kvLora, V: 2 * p.idxDim, VFloat32: true}
		} else {
			ly.dsa.src = *prev
		}
		*prev = ly.dsa
		m.layout = append(m.layout, width)
	}
	if p.mlpTypes[i] == sparseFFN {
		ly.ffn = l.moe(pre + "mlp")
	} else {
		ly.ffn = l.mlp(pre+"mlp", p.inter)
	}
	return ly
}

// norm loads an RMSNorm (rms_norm_eps) onto the device.
func (l *loader) norm(name string) *gqa.Norm {
	return l.u.Norm(l.RMSNorm(name, l.p.hidden, l.p.eps, false))
}

// linear loads a bias-free projection.
func (l *loader) linear(name string, out, in int) gqa.Linear {
	return l.u.Linear(l.Linear(name, out, in, false))
}

// Info implements model.Model.
func (m *Model) Info() model.Info {
	var state int64
	for _, s := range m.states {
		state += s.Bytes()
	}
	return model.Info{
		Arch:             arch,
		Vocab:            m.p.vocab,
		Hidden:           m.p.hidden,
		Layers:           m.p.layers,
		MaxContext:       m.p.maxContext,
		KVBytesPerToken:  m.layout.BytesPerToken(),
		StateBytesPerSeq: state,
	}
}

// CacheLayout implements model.Model: per decoder layer, zero width for a
// KDA layer, and K = kv_lora_rank (the normed latent c_t) with V =
// 2·index_head_dim (the indexer's k_t and γ_t; the last token of a complete
// pool holds the pool's key instead) for a DSA layer (V = 0 when it shares
// the previous layer's selection); then the MTP layer, laid out as a DSA
// layer, when loaded. The latents are BF16 unless SetCacheDType says
// otherwise; the indexer data stay F32 (VFloat32): rounding the keys
// flips near-tied pool selections, which moves a token's attention far
// more than the rounding itself (on the fixture, the first greedy token).
func (m *Model) CacheLayout() kvcache.Layout { return slices.Clone(m.layout) }

// StateLayout implements model.StateModel: one entry per KDA layer, in layer
// order: S [heads, dk, dk] and the conv state [K−1, 3·heads·dk].
func (m *Model) StateLayout() []linattn.LayerShape { return slices.Clone(m.states) }

// Device implements model.DeviceModel.
func (m *Model) Device() kernels.Device { return m.dev }

// SetCacheDType implements model.DeviceModel (the MTP layer's decoder
// shares the layout).
func (m *Model) SetCacheDType(dt kernels.DType) error {
	if err := gqa.SetLayoutDType(m.layout, dt); err != nil {
		return fmt.Errorf("glm5_next: %w", err)
	}
	return nil
}

// ForwardMTP implements model.MTPModel: the NextN layer (a plain pre-norm
// block: NoPE MLA with its own k-pool indexer and cache layer, and the
// clamped MoE) on gqa's MTP decoder. Row i of sequence s combines hidden[s]
// row i (the main model's post-final-norm hidden state at position Pos+i)
// with the embedding of Tokens[i] (the token at Pos+i+1):
//
//	x = eh_proj([enorm(embed(tok)) | hnorm(h)])
//	x = x + Attn(input_layernorm(x));  x = x + FFN(post_attention_layernorm(x))
//	logits = shared_head.head(shared_head.norm(x))
//
// Hidden returns shared_head.norm(x). The batch's States are not used.
func (w withMTP) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	out, err := w.mtp.ForwardMTP(b, hidden)
	if err != nil {
		return nil, fmt.Errorf("glm5_next: %w", err)
	}
	return out, nil
}

// validate checks b for a main-model pass: the batch and its cache, and
// the recurrent-state slots in the model's device memory.
func (m *Model) validate(b *model.Batch) error {
	if err := gqa.CheckBatch(b, m.p.vocab, m.layout, m.dev); err != nil {
		return fmt.Errorf("glm5_next: %w", err)
	}
	if err := gqa.CheckStates(b, m.states, m.dev); err != nil {
		return fmt.Errorf("glm5_next: %w", err)
	}
	return nil
}

// Forward implements model.Model. Each sequence's KDA state is read from
// and written back to Seq.State; a sequence at Pos 0 starts from a zeroed
// state. Hidden returns the post-final-norm hidden states (the final norm
// of the mean of the streams), the input of the MTP layer.
func (m *Model) Forward(b *model.Batch) (*model.Output, error) {
	if err := m.validate(b); err != nil {
		return nil, err
	}
	if len(b.Seqs) == 0 {
		return &model.Output{}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st, streamIDs, err := m.upload(b)
	if err != nil {
		return nil, err
	}
	var logits, hid kernels.Tensor
	gqa.InStep(m.dev, func() { logits, hid = m.launch(b, st, streamIDs) })
	return st.Outputs(m.dev, b, logits, hid), nil
}

// upload writes b's step inputs (m.mu held) and returns them with the
// token ids once per stream (N·hc, 1).
func (m *Model) upload(b *model.Batch) (*gqa.Step, kernels.Tensor, error) {
	dev := m.dev
	st, err := m.in.Upload(dev, b)
	if err == nil && len(m.states) > 0 {
		err = m.in.UploadStates(dev, b, st) // a sequence at Pos 0 starts from a zeroed state
	}
	var streamIDs kernels.Tensor
	if err == nil {
		streamIDs, err = m.streams.upload(dev, b, m.p.hc)
	}
	if err != nil {
		return nil, streamIDs, fmt.Errorf("glm5_next: %w", err)
	}
	st.Top = b.Top
	return st, streamIDs, nil
}

// launch queues the main model's pass inside a step and returns Head's
// logits and hidden rows.
func (m *Model) launch(b *model.Batch, st *gqa.Step, streamIDs kernels.Tensor) (logits, hid kernels.Tensor) {
	dev := m.dev
	n, H, hc := b.Tokens(), m.p.hidden, m.p.hc
	c := st.Ctx(dev, b)
	c.Lin = dev
	X := dev.Scratch(kernels.F32, n, hc*H) // (N, hc·hidden) residual streams
	// Every stream starts as the token's embedding.
	dev.Embed(X.Reshape(n*hc, H), m.embed, streamIDs)
	y := dev.Scratch(kernels.F32, n, H)           // (N, hidden) sublayer input
	o := dev.Scratch(kernels.F32, n, H)           // (N, hidden) sublayer output
	coef := dev.Scratch(kernels.F32, n, hc+hc*hc) // (N, hc+hc²) [post | comb]
	for i, l := range m.layers {
		m.layerForward(c, l, i, X, y, o, coef)
	}
	dev.HyperMerge(y, X)
	dev.RMSNorm(y, y, m.norm.W, m.norm.Eps, m.norm.Offset)
	return st.Head(dev, y, m.lmHead)
}

// SpecReady implements model.SpecModel.
func (w withMTP) SpecReady() bool { return gqa.SpecReady(w.dev) }

// ForwardSpec implements model.SpecModel: the NextN layer's draft passes
// and the main model's verification in one device step.
func (w withMTP) ForwardSpec(s *model.SpecStep) ([]*model.Output, *model.Output, error) {
	m := w.Model
	if !w.SpecReady() {
		return nil, nil, fmt.Errorf("glm5_next: the %T backend cannot feed drafts on the device", m.dev)
	}
	b := s.Verify
	if b == nil {
		return nil, nil, fmt.Errorf("glm5_next: speculative step without a verification batch")
	}
	if err := m.validate(b); err != nil {
		return nil, nil, err
	}
	sd, err := m.mtp.PrepareDrafts(s, m.p.hc)
	if err != nil {
		return nil, nil, fmt.Errorf("glm5_next: %w", err)
	}
	defer sd.Release()
	m.mu.Lock()
	defer m.mu.Unlock()
	st, streamIDs, err := m.upload(b)
	if err != nil {
		return nil, nil, err
	}
	var logits, hid kernels.Tensor
	gqa.InStep(m.dev, func() {
		sd.Launch()
		sd.FeedVerify(streamIDs, 0)
		kernels.SetRowExact(m.dev, st.Exact)
		logits, hid = m.launch(b, st, streamIDs)
	})
	var r gqa.Reads // everything in one wait
	drafts := sd.OutputReads(&r)
	out := st.OutputReads(&r, m.dev, b, logits, hid)
	r.Read(m.dev)
	return drafts(), out(), nil
}

// layerForward runs decoder layer l (index i) on the streams X (N,
// hc·hidden): at each site the streams collapse into the sublayer's input,
// which is normed, and the sublayer's output is mixed back in.
func (m *Model) layerForward(c *gqa.Ctx, l *layer, i int, X, y, o, coef kernels.Tensor) {
	dev := m.dev
	dev.HyperPre(y, coef, X, l.attnHC)
	dev.RMSNorm(y, y, l.attnNorm.W, l.attnNorm.Eps, l.attnNorm.Offset)
	if l.kda != nil {
		l.kda.Forward(c, o, y)
	} else {
		l.dsa.Forward(c, o, y)
		if m.traceSel != nil && l.dsa.idx != nil {
			m.traceSel(i, l.dsa.sel)
		}
	}
	dev.HyperPost(X, o, coef)

	dev.HyperPre(y, coef, X, l.ffnHC)
	dev.RMSNorm(y, y, l.ffnNorm.W, l.ffnNorm.Eps, l.ffnNorm.Offset)
	l.ffn.Forward(c, o, y)
	dev.HyperPost(X, o, coef)
	if m.trace != nil {
		m.trace(i, X)
	}
}

// ReserveSteps implements model.StepReserver: the step's row maps and
// state slots, the ids once per stream, and the NextN layer's inputs.
func (m *Model) ReserveSteps(tokens, seqs, blocks int) error {
	m.mu.Lock()
	err := m.in.Reserve(m.dev, tokens, seqs, blocks, true)
	if err == nil {
		_, err = gqa.EnsureI32(m.dev, &m.streams.ids, tokens*m.p.hc)
	}
	m.mu.Unlock()
	if err != nil || m.mtp == nil {
		return err
	}
	return m.mtp.ReserveSteps(tokens, seqs, blocks)
}

// streamInputs are the step's token ids repeated once per stream, kept on
// the device between steps.
type streamInputs struct {
	ids  kernels.Tensor // device buffer, grown as needed
	host []int32        // host staging
}

// upload writes b's token ids, each hc times, and returns them (N·hc, 1).
func (si *streamInputs) upload(dev kernels.Device, b *model.Batch, hc int) (kernels.Tensor, error) {
	si.host = si.host[:0]
	for i := range b.Seqs {
		for _, t := range b.Seqs[i].Tokens {
			for range hc {
				si.host = append(si.host, t)
			}
		}
	}
	t, err := gqa.EnsureI32(dev, &si.ids, len(si.host))
	if err != nil {
		return t, err
	}
	dev.WriteI32(t, si.host)
	return t, nil
}

// hyper loads an mHC site (prefix hc_attn or hc_ffn).
func (l *loader) hyper(prefix string) *kernels.Hyper {
	p := l.p
	m := (2 + p.hc) * p.hc
	h := &kernels.Hyper{
		Fn:      l.Mat(prefix+"_fn", m, p.hc*p.hidden),
		Base:    l.u.Vec(l.Vec(prefix+"_base", m)),
		Streams: p.hc, Iters: p.hcIters, Eps: p.hcEps, NormEps: p.eps,
	}
	if sc := l.Vec(prefix+"_scale", 3); len(sc) == 3 {
		h.Scale = [3]float32(sc)
	}
	return h
}

// mlp loads a dense clamped-SwiGLU MLP (also the shared expert).
func (l *loader) mlp(prefix string, inter int) *gqa.MLP {
	m := l.u.MLP(l.MLP(prefix, nn.HFNames, l.p.hidden, inter, false))
	m.Limit = l.p.clamp()
	return m
}

// moe loads the sparse block: DeepSeek-V3 noaux_tc routing (sigmoid
// scores, e_score_correction_bias for selection only, −inf group masking,
// renormalised weights × routed_scaling_factor) over clamped-SwiGLU
// experts, plus the always-on shared expert of width
// moe_intermediate_size·n_shared_experts.
func (l *loader) moe(prefix string) *gqa.MoE {
	p := l.p
	m := &gqa.MoE{
		Gate: l.Mat(prefix+".gate.weight", p.experts, p.hidden), // (experts, hidden)
		Router: kernels.Router{
			Bias:       l.u.Vec(l.Vec(prefix+".gate.e_score_correction_bias", p.experts)), // (1, experts)
			Scoring:    kernels.SigmoidScoring,
			TopK:       p.topK,
			NormTopK:   p.normTopK,
			Scale:      p.scale,
			Groups:     p.groups,
			TopKGroups: p.topKGroups,
		},
		Experts: l.Experts(prefix+".experts", nn.HFNames, p.experts, p.hidden, p.moeInter),
		Limit:   p.clamp(),
	}
	if p.shared > 0 {
		m.Shared = l.mlp(prefix+".shared_experts", p.moeInter*p.shared)
	}
	return m
}

// clamp is the SwiGLU clamp of gqa's MLP and MoE: swiglu_limit, or 0 (none)
// when it is null.
func (p *params) clamp() float32 {
	if math.IsInf(float64(p.limit), 1) {
		return 0
	}
	return p.limit
}

// mtp loads the NextN layer (layers.{num_hidden_layers}.*) into a gqa
// MTP decoder that shares m's embedding and device; its cache layer,
// laid out as a DSA layer's, is appended to m's layout, which the decoder
// shares (SetCacheDType changes both).
func (l *loader) mtp(pre string, m *Model) *gqa.MTPDecoder {
	p := l.p
	blk := &gqa.Block{
		AttnNorm: l.norm(pre + "input_layernorm"),
		Mixer:    l.dsa(pre+"self_attn.", p.layers, true),
		FFNNorm:  l.norm(pre + "post_attention_layernorm"),
	}
	if l.Has(pre + "mlp.gate.weight") {
		blk.FFN = l.moe(pre + "mlp")
	} else {
		blk.FFN = l.mlp(pre+"mlp", p.inter)
	}
	nx, err := gqa.LoadNextNAt(l.Loader, l.u, pre, p.hidden, p.eps, blk, m.lmHead)
	if err != nil {
		l.Fail(err)
		return nil
	}
	var d *gqa.MTPDecoder
	dec, err := gqa.NewDecoder(l.dev, arch, m.embed, nil, nil, m.lmHead, m.layout, p.maxContext)
	if err == nil {
		d, err = dec.WithNextN(nx, kvcache.LayerWidth{K: p.kvLora, V: 2 * p.idxDim, VFloat32: true})
	}
	if err != nil {
		l.Fail(err)
		return nil
	}
	m.layout = d.Layout
	return d
}
