package kernels

import "context"

// WeightPreparer is an optional capability of a Backend that keeps, per
// weight matrix, a form of it made on the matrix's first MatMul (the CPU
// backend's copies of BF16 weights in huge pages and its repacked Q4_0 and
// Q8_0 weights): PrepareWeights makes those forms for ws ahead of time, so
// that the first request does not wait for them. It makes exactly what the
// first MatMuls would make (the same rules: what a backend does not keep
// for a matrix it skips) and nothing twice: a MatMul of a matrix being
// prepared waits for that one form. The caller leaves out the matrices that
// MatMul never multiplies as a whole (lookup-only embeddings) or only now
// and then (a mixture's routed experts), and calls it after the settings
// that choose a backend's path (SetBF16Activations).
//
// Unlike the backend's ops, PrepareWeights may run on a goroutine of its
// own while the engine runs steps: it returns ctx.Err() soon after ctx is
// done (a matrix it has begun is finished first), nil when all of ws is
// prepared. A backend that needs no preparation (a GPU's weights are
// uploaded as the model is built) does not implement it.
type WeightPreparer interface {
	PrepareWeights(ctx context.Context, ws []*Mat) error
}

// WeightCopier is an optional capability of a Backend that keeps whole
// copies of some weight matrices (the CPU backend's resident BF16 copies):
// HasCopy reports whether w has one made, which MatMul reads instead of
// w.Data. The caller may then give back the pages behind w.Data where they
// can come back from a file (engine/weights.ReleasePages); a path that
// still reads w.Data faults them in again.
type WeightCopier interface {
	HasCopy(w *Mat) bool
}

// PrepareWeights calls be.PrepareWeights(ctx, ws) when be is a
// WeightPreparer and reports whether it is, with its error.
func PrepareWeights(ctx context.Context, be any, ws []*Mat) (bool, error) {
	p, ok := be.(WeightPreparer)
	if !ok {
		return false, nil
	}
	return true, p.PrepareWeights(ctx, ws)
}

// KVBDeclarer is an optional capability of a WeightPreparer with MLAOps
// that keeps, per kv_b_proj matrix, a form of it made on the matrix's first
// AttentionMLA (the CPU backend's per-head W_UK and W_UV for the absorbed
// form): that form needs the layer's MLAShape, which a Mat does not carry.
// An MLA model declares each layer's kv_b_proj with its shape as it is
// built (DeclareKVB); PrepareWeights then makes that form too for a
// declared matrix among its ws, as the first AttentionMLA in the absorbed
// form would (none for a shape whose Form is MLANaive). A declaration makes
// nothing by itself.
type KVBDeclarer interface {
	DeclareKVB(kvB *Mat, s MLAShape)
}

// DeclareKVB calls be.DeclareKVB(kvB, s) when be is a KVBDeclarer and kvB
// is not nil.
func DeclareKVB(be any, kvB *Mat, s MLAShape) {
	if d, ok := be.(KVBDeclarer); ok && kvB != nil {
		d.DeclareKVB(kvB, s)
	}
}
