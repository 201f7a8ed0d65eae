package nn

// MLP is the SwiGLU feed-forward block's weights as loaded:
// down(silu(gate(x)) ⊙ up(x)).
type MLP struct {
	Gate *Linear // (inter, hidden)
	Up   *Linear // (inter, hidden)
	Down *Linear // (hidden, inter)
}
