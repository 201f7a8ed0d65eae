package bench

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Counter is a model.WeightSource that passes every request on to another
// source and records what was loaded, so that the bytes a decode step reads
// can be worked out afterwards (Footprint). Safe for concurrent use.
type Counter struct {
	src model.WeightSource

	mu      sync.Mutex
	tensors map[string]tensor // by name and expert index
}

// tensor is one loaded weight as Counter saw it.
type tensor struct {
	name   string
	expert int // Expert's index; -1 for Mat and Float32
	bytes  int64
	params int64
}

// NewCounter wraps src.
func NewCounter(src model.WeightSource) *Counter {
	return &Counter{src: src, tensors: map[string]tensor{}}
}

// Has passes through.
func (c *Counter) Has(name string) bool { return c.src.Has(name) }

// Mat loads and records a matrix.
func (c *Counter) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := c.src.Mat(name, rows, cols)
	if err == nil {
		c.recordMat(name, -1, m)
	}
	return m, err
}

// Expert loads and records one expert's matrix.
func (c *Counter) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	m, err := c.src.Expert(name, e, rows, cols)
	if err == nil {
		c.recordMat(name, e, m)
	}
	return m, err
}

// Float32 loads and records a small tensor (norms, biases): the engine
// keeps it as float32, so that is what a step reads.
func (c *Counter) Float32(name string, shape ...int) ([]float32, error) {
	v, err := c.src.Float32(name, shape...)
	if err == nil {
		c.record(tensor{name: name, expert: -1, bytes: 4 * int64(len(v)), params: int64(len(v))})
	}
	return v, err
}

func (c *Counter) recordMat(name string, e int, m *kernels.Mat) {
	c.record(tensor{name: name, expert: e,
		bytes:  m.DataBytes() + 4*int64(len(m.Scale)),
		params: int64(m.Rows) * int64(m.Cols)})
}

// record stores t once per name and expert: a tensor loaded twice (a tied
// embedding, a shared head) is read once per step.
func (c *Counter) record(t tensor) {
	c.mu.Lock()
	c.tensors[t.name+"#"+strconv.Itoa(t.expert)] = t
	c.mu.Unlock()
}

// Footprint is a model's weights sorted by how a decode step reads them.
type Footprint struct {
	Params     int64 // elements of every loaded tensor
	TotalBytes int64 // bytes of every loaded tensor, as held in memory

	// DenseBytes is what every decode step reads in full: attention,
	// dense MLPs, shared experts, routers, norms, and the LM head (the
	// embedding table when the embeddings are tied).
	DenseBytes int64
	// EmbeddingBytes is an untied input embedding table: a step reads one
	// row per token, so it is left out of the per-step bytes.
	EmbeddingBytes int64
	// ExpertBytes is every routed expert of every MoE layer; a step reads
	// only the experts its tokens are routed to (see DecodeBytes).
	ExpertBytes int64
	// MTPBytes is the multi-token-prediction module (mtp.*, or the NextN
	// layer model.layers.{num_hidden_layers}.*), read only when drafting.
	MTPBytes int64

	MoELayers int // layers with routed experts
	Experts   int // routed experts per MoE layer (the largest seen)
	TopK      int // experts per token (config num_experts_per_tok); 0 when unknown
	Tied      bool

	groups []expertGroup
}

// expertGroup is one MoE layer's routed experts.
type expertGroup struct {
	n     int   // experts
	bytes int64 // all of them
}

var reExpert = regexp.MustCompile(`^(.*\.experts)\.(\d+)\.`)

// Footprint classifies what was loaded. layers is the main stack's depth
// (model.Info().Layers: a layer index at or past it is an MTP layer) and
// topK the routed experts per token (0 if unknown: every expert counts).
func (c *Counter) Footprint(layers, topK int) Footprint {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := Footprint{TopK: topK}
	untied := false
	for _, t := range c.tensors {
		if model.OutputHead(t.name, layers) {
			untied = true
		}
	}
	f.Tied = !untied
	type acc struct {
		ids   map[int]bool // expert indices seen
		bytes int64
	}
	groups := map[string]*acc{}
	for _, t := range c.tensors {
		f.Params += t.params
		f.TotalBytes += t.bytes
		switch {
		case model.MTPWeight(t.name, layers):
			f.MTPBytes += t.bytes
		case t.expert >= 0 || reExpert.MatchString(t.name):
			g, e := t.name, t.expert
			if m := reExpert.FindStringSubmatch(t.name); m != nil {
				g = m[1]
				e, _ = strconv.Atoi(m[2])
			} else if i := strings.LastIndex(g, "."); i >= 0 {
				g = g[:i] // fused: "...experts.gate_up_proj" → "...experts"
			}
			gr := groups[g]
			if gr == nil {
				gr = &acc{ids: map[int]bool{}}
				groups[g] = gr
			}
			gr.ids[e] = true
			gr.bytes += t.bytes
			f.ExpertBytes += t.bytes
		case untied && strings.Contains(t.name, "embed_tokens"):
			f.EmbeddingBytes += t.bytes
		default:
			f.DenseBytes += t.bytes
		}
	}
	for _, g := range groups {
		f.groups = append(f.groups, expertGroup{n: len(g.ids), bytes: g.bytes})
		f.Experts = max(f.Experts, len(g.ids))
	}
	f.MoELayers = len(f.groups)
	return f
}

// ActiveExperts is the expected number of distinct experts, out of n, that
// batch tokens each routed to k of them touch, when routing is uniform and
// independent: n·(1 − (1 − k/n)^batch). With k unknown (0) it is n.
func ActiveExperts(n, k, batch int) float64 {
	if n == 0 {
		return 0
	}
	if k <= 0 || k >= n {
		return float64(n)
	}
	return float64(n) * (1 - math.Pow(1-float64(k)/float64(n), float64(max(batch, 1))))
}

// DecodeBytes is the weight bytes one decode step over batch sequences
// reads: the dense part once, plus each MoE layer's experts scaled by the
// expected fraction the batch activates (exactly top-k of n at batch 1;
// real routing is not uniform, so at larger batches this is an estimate).
// mtpPasses adds the MTP module that many times (a drafting step runs it
// once per draft token).
func (f Footprint) DecodeBytes(batch, mtpPasses int) int64 {
	b := float64(f.DenseBytes)
	for _, g := range f.groups {
		b += float64(g.bytes) * ActiveExperts(g.n, f.TopK, batch) / float64(g.n)
	}
	b += float64(mtpPasses) * float64(f.MTPBytes)
	return int64(math.Round(b))
}
