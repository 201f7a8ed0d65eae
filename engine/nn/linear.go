package nn

import "github.com/ferrite-llm/ferrite/kernels"

// Linear is y = x·Wᵀ + b.
type Linear struct {
	W *kernels.Mat // (out, in)
	B []float32    // (out); nil when the layer has no bias
}

// Out is the output width.
func (l *Linear) Out() int { return l.W.Rows }

// In is the input width.
func (l *Linear) In() int { return l.W.Cols }

// Forward sets y (n, out) = x (n, in)·Wᵀ + b.
func (l *Linear) Forward(be kernels.Backend, y, x []float32, n int) {
	be.MatMul(y, x, l.W, n)
	if l.B != nil {
		out := l.W.Rows
		for i := range n {
			row := y[i*out : (i+1)*out]
			for j, b := range l.B {
				row[j] += b
			}
		}
	}
}
