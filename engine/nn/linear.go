package nn

import "github.com/ferrite-llm/ferrite/kernels"

// Linear is a projection's weights as loaded: y = x·Wᵀ + b.
type Linear struct {
	W *kernels.Mat // (out, in)
	B []float32    // (out); nil when the layer has no bias
}

// Out is the output width.
func (l *Linear) Out() int { return l.W.Rows }

// In is the input width.
func (l *Linear) In() int { return l.W.Cols }
