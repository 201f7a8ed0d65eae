package nn

import "github.com/ferrite-llm/ferrite/kernels"

// MLP is the SwiGLU feed-forward block: down(silu(gate(x)) ⊙ up(x)).
type MLP struct {
	Gate *Linear // (inter, hidden)
	Up   *Linear // (inter, hidden)
	Down *Linear // (hidden, inter)
}

// Forward sets y (n, hidden) = MLP(x (n, hidden)), taking scratch from a.
func (m *MLP) Forward(be kernels.Backend, a *Arena, y, x []float32, n int) {
	mark := a.Mark()
	inter := m.Gate.Out()
	g := a.Get(n * inter) // (n, inter)
	u := a.Get(n * inter) // (n, inter)
	m.Gate.Forward(be, g, x, n)
	m.Up.Forward(be, u, x, n)
	for i, v := range g {
		g[i] = Silu(v) * u[i]
	}
	m.Down.Forward(be, y, g, n)
	a.Release(mark)
}
