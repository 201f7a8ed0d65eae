package nn

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// recording is a checkpoint that holds every tensor and lists the names
// and shapes asked for.
type recording struct{ asked []string }

func (r *recording) Has(string) bool { return false } // per-expert storage

func (r *recording) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	r.asked = append(r.asked, fmt.Sprintf("%s %dx%d", name, rows, cols))
	return &kernels.Mat{Rows: rows, Cols: cols}, nil
}

func (r *recording) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	return r.Mat(fmt.Sprintf("%s[%d]", name, e), rows, cols)
}

func (r *recording) Float32(name string, shape ...int) ([]float32, error) {
	r.asked = append(r.asked, fmt.Sprintf("%s %v", name, shape))
	n := 1
	for _, d := range shape {
		n *= d
	}
	return make([]float32, n), nil
}

// The MoE loaders ask for the tensors under Hugging Face's names, with the
// shapes of the config, and set the router as the architectures need it.
func TestMoELoaders(t *testing.T) {
	r := &recording{}
	l := NewLoader(r)
	m := l.SoftmaxMoE("p", MixtralNames, 2, 1, true, 4, 3)
	want := []string{"p.gate.weight 2x4",
		"p.experts.0.w1.weight 3x4", "p.experts.0.w3.weight 3x4", "p.experts.0.w2.weight 4x3",
		"p.experts.1.w1.weight 3x4", "p.experts.1.w3.weight 3x4", "p.experts.1.w2.weight 4x3"}
	if !slices.Equal(r.asked, want) {
		t.Errorf("SoftmaxMoE loaded\n%q\nwant\n%q", r.asked, want)
	}
	if rt := m.Router; rt.Scoring != SoftmaxScoring || rt.TopK != 1 || !rt.NormTopK || rt.Scale != 1 || rt.Bias != nil || m.Shared != nil {
		t.Errorf("SoftmaxMoE router %+v, shared %v", rt, m.Shared)
	}

	r.asked = nil
	s := GroupedMoEShape{Experts: 2, TopK: 1, Inter: 3, Shared: 2, Groups: 1, TopKGroups: 1}
	m = l.GroupedMoE("p", s, 4, false, 2.5)
	want = []string{"p.gate.weight 2x4", "p.gate.e_score_correction_bias [2]",
		"p.experts.0.gate_proj.weight 3x4", "p.experts.0.up_proj.weight 3x4", "p.experts.0.down_proj.weight 4x3",
		"p.experts.1.gate_proj.weight 3x4", "p.experts.1.up_proj.weight 3x4", "p.experts.1.down_proj.weight 4x3",
		"p.shared_experts.gate_proj.weight 6x4", "p.shared_experts.up_proj.weight 6x4", "p.shared_experts.down_proj.weight 4x6"}
	if !slices.Equal(r.asked, want) {
		t.Errorf("GroupedMoE loaded\n%q\nwant\n%q", r.asked, want)
	}
	if rt := m.Router; rt.Scoring != SigmoidScoring || rt.TopK != 1 || rt.NormTopK || rt.Scale != 2.5 || len(rt.Bias) != 2 || m.Shared == nil {
		t.Errorf("GroupedMoE router %+v, shared %v", rt, m.Shared)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
}
