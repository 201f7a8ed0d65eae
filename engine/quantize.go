package engine

import (
	"fmt"
	"strings"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Quantization on load: Options.Quant turns a checkpoint's matrices into a
// GGML block-quantized type in memory as the model is built, for users who
// hold a bf16/f16/f32 checkpoint and want the speed and memory of int8 or
// 4-bit weights. Norms, biases and other vectors stay float32 (they are read
// through Float32). Of the matrices, these stay in their stored dtype:
//   - MoE router gates (".gate.weight", "shared_expert_gate",
//     "compress_gate"): small, and routing decisions are sensitive to them;
//   - MLA's kv_b_proj: it is split per head in place from its stored bytes;
//   - matrices whose width is not a multiple of the block (then Q8_0 is
//     tried before keeping the stored dtype).
//
// Embeddings and the output head are quantized too (gathered rows are
// dequantized exactly): with "q8_0" everything is Q8_0; with "q4_k" the
// output head is Q6_K, as in llama.cpp's Q4_K_M, and so are the embeddings
// (often that same tied tensor; llama.cpp keeps an untied one in Q4_K), and
// the rest Q4_K.

// QuantTypes are the Options.Quant values Load accepts.
var QuantTypes = []string{"q8_0", "q4_k"}

// quantPlan is what one Options.Quant value does.
type quantPlan struct {
	body, head kernels.DType // most matrices; output head and embeddings
}

func parseQuant(s string) (quantPlan, error) {
	switch strings.ToLower(s) {
	case "q8_0":
		return quantPlan{kernels.Q8_0, kernels.Q8_0}, nil
	case "q4_k":
		return quantPlan{kernels.Q4K, kernels.Q6K}, nil
	}
	return quantPlan{}, fmt.Errorf("unknown quantization %q (want one of %s)", s, strings.Join(QuantTypes, ", "))
}

// quantSource is a model.WeightSource that quantizes the matrices it hands
// out; the same tensor (a tied embedding) is quantized once.
type quantSource struct {
	model.WeightSource
	plan quantPlan
	be   kernels.Backend // spreads the work over its threads

	mu   sync.Mutex
	done map[string]*kernels.Mat // by name#expert
}

func newQuantSource(src model.WeightSource, plan quantPlan, be kernels.Backend) *quantSource {
	return &quantSource{WeightSource: src, plan: plan, be: be, done: map[string]*kernels.Mat{}}
}

func (q *quantSource) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := q.WeightSource.Mat(name, rows, cols)
	if err != nil {
		return nil, err
	}
	return q.quantize(name, -1, m)
}

func (q *quantSource) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	m, err := q.WeightSource.Expert(name, e, rows, cols)
	if err != nil {
		return nil, err
	}
	return q.quantize(name, e, m)
}

// target is the dtype tensor name becomes, or ok false to keep it.
func (q *quantSource) target(name string, cols int) (dt kernels.DType, ok bool) {
	for _, keep := range []string{".gate.weight", "shared_expert_gate", "compress_gate", "kv_b_proj"} {
		if strings.Contains(name, keep) {
			return 0, false
		}
	}
	dt = q.plan.body
	if strings.Contains(name, "lm_head") || strings.Contains(name, "embed_tokens") || strings.Contains(name, "shared_head.head") {
		dt = q.plan.head
	}
	for _, c := range []kernels.DType{dt, kernels.Q8_0} {
		if cols%c.BlockElems() == 0 {
			return c, true
		}
	}
	return 0, false
}

func (q *quantSource) quantize(name string, e int, m *kernels.Mat) (*kernels.Mat, error) {
	dt, ok := q.target(name, m.Cols)
	if !ok || m.DType.Quantized() {
		return m, nil
	}
	key := fmt.Sprintf("%s#%d", name, e)
	q.mu.Lock()
	if d, ok := q.done[key]; ok {
		q.mu.Unlock()
		return d, nil
	}
	q.mu.Unlock()
	var out *kernels.Mat
	if m.Random != nil && m.Data == nil {
		// Random weights a device would generate (benchmarks): random
		// blocks of dt from the same seed and of the same magnitude
		// (kernels.RandomFill), made at memory speed, where quantizing the
		// random values took minutes for a 30B model.
		out = &kernels.Mat{DType: dt, Rows: m.Rows, Cols: m.Cols, Random: m.Random}
		out.Materialize()
	} else {
		out = &kernels.Mat{DType: dt, Rows: m.Rows, Cols: m.Cols, Data: make([]byte, m.Rows*dt.RowBytes(m.Cols))}
		rb := dt.RowBytes(m.Cols)
		q.be.Parallel(m.Rows, func(lo, hi int) {
			row := make([]float32, m.Cols) // (cols) one decoded row
			for r := lo; r < hi; r++ {
				m.RowF32(row, r)
				kernels.QuantizeRow(dt, out.Data[r*rb:(r+1)*rb], row)
			}
		})
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if d, ok := q.done[key]; ok {
		return d, nil
	}
	q.done[key] = out
	return out, nil
}
