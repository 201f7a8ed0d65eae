package gqa

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Weight rearrangements done once at load, so that a step's projections
// land directly in the layout the ops read. They copy host bytes, so they
// materialize a Random matrix that has none yet (kernels.Mat.Materialize).

// SplitCols copies the left and right column halves of w (rows, 2·k) into
// two (rows, k) matrices; a block-quantized w splits between its blocks.
func SplitCols(w *kernels.Mat) (left, right *kernels.Mat, err error) {
	k := w.Cols / 2
	if w.Cols%2 != 0 || w.DType == kernels.F8E4M3 || k%w.DType.BlockElems() != 0 || w.DType.RowBytes(k) == 0 {
		return nil, nil, fmt.Errorf("gqa: eh_proj %v (%d, %d) cannot be split into column halves", w.DType, w.Rows, w.Cols)
	}
	w.Materialize()
	rb, hb := w.DType.RowBytes(w.Cols), w.DType.RowBytes(k)
	left = &kernels.Mat{DType: w.DType, Rows: w.Rows, Cols: k, Data: make([]byte, w.Rows*hb)}
	right = &kernels.Mat{DType: w.DType, Rows: w.Rows, Cols: k, Data: make([]byte, w.Rows*hb)}
	for r := range w.Rows {
		copy(left.Data[r*hb:(r+1)*hb], w.Data[r*rb:r*rb+hb])
		copy(right.Data[r*hb:(r+1)*hb], w.Data[r*rb+hb:(r+1)*rb])
	}
	return left, right, nil
}

// SelectRows copies rows idx of w into a new (len(idx), w.Cols) matrix:
// row i is w's row idx[i]. An F8E4M3 matrix with block scales can only be
// rearranged in whole, aligned row blocks, which keep their scales.
func SelectRows(w *kernels.Mat, idx []int) (*kernels.Mat, error) {
	w.Materialize()
	out := &kernels.Mat{DType: w.DType, Rows: len(idx), Cols: w.Cols, BlockRows: w.BlockRows, BlockCols: w.BlockCols}
	rb := w.DType.RowBytes(w.Cols)
	if w.DType == kernels.F8E4M3 {
		rb = w.Cols
	}
	out.Data = make([]byte, len(idx)*rb)
	for i, r := range idx {
		if r < 0 || r >= w.Rows {
			return nil, fmt.Errorf("gqa: row %d of a (%d, %d) matrix", r, w.Rows, w.Cols)
		}
		copy(out.Data[i*rb:(i+1)*rb], w.Data[r*rb:(r+1)*rb])
	}
	if w.Scale == nil {
		return out, nil
	}
	br, sc := w.BlockRows, (w.Cols+w.BlockCols-1)/w.BlockCols
	for i := 0; i < len(idx); i += br {
		r := idx[i]
		aligned := r%br == 0
		for j := i; j < min(i+br, len(idx)); j++ {
			aligned = aligned && idx[j] == r+j-i
		}
		if !aligned || (i+br > len(idx) && r+len(idx)-i != w.Rows) {
			return nil, fmt.Errorf("gqa: rows of an F8E4M3 matrix with %d-row scale blocks cannot be rearranged across blocks", br)
		}
		out.Scale = append(out.Scale, w.Scale[r/br*sc:(r/br+1)*sc]...)
	}
	return out, nil
}

// StackRows concatenates matrices of one dtype and width by rows (several
// projections of one input as one product). Every dtype stores rows
// independently, except F8E4M3 with block scales, whose row blocks must
// not straddle two matrices.
func StackRows(ms ...*kernels.Mat) (*kernels.Mat, error) {
	first := ms[0]
	out := &kernels.Mat{DType: first.DType, Cols: first.Cols, BlockRows: first.BlockRows, BlockCols: first.BlockCols}
	for _, m := range ms {
		if m.DType != first.DType || m.Cols != first.Cols || m.BlockRows != first.BlockRows || m.BlockCols != first.BlockCols {
			return nil, fmt.Errorf("gqa: cannot stack %v (%d, %d) onto %v (%d, %d)", m.DType, m.Rows, m.Cols, first.DType, first.Rows, first.Cols)
		}
		if m.DType == kernels.F8E4M3 && m.BlockRows > 0 && m.Rows%m.BlockRows != 0 {
			return nil, fmt.Errorf("gqa: cannot stack F8E4M3 rows (%d) that do not fill their scale blocks (%d)", m.Rows, m.BlockRows)
		}
		out.Rows += m.Rows
		m.Materialize()
		out.Data = append(out.Data, m.Data[:m.DType.RowBytes(m.Cols)*m.Rows]...)
		out.Scale = append(out.Scale, m.Scale...)
	}
	return out, nil
}
