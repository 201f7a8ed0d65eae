package kernels

// Panic messages for bad MatMul arguments, shared by every backend so that a
// shape mistake reads the same whichever backend caught it.
const (
	errNilWeight   = "kernels: MatMul nil weight"
	errNegative    = "kernels: MatMul negative size"
	errShortX      = "kernels: MatMul short x"
	errShortY      = "kernels: MatMul short y"
	errBadDType    = "kernels: MatMul unknown dtype"
	errShortData   = "kernels: MatMul short weight data"
	errBadBlock    = "kernels: MatMul bad F8 block shape"
	errShortScales = "kernels: MatMul short F8 scales"
	errPartBlock   = "kernels: MatMul quantized row not a whole number of blocks"
)

// CheckMatMul panics with a constant "kernels: MatMul ..." message unless
// y = x·wᵀ for n rows is well-formed: n, w.Rows, w.Cols ≥ 0, x holds at least
// (n, w.Cols) and y (n, w.Rows) elements, w.Data holds (w.Rows, w.Cols)
// elements of a known dtype (whole blocks of a quantized one), and an F8E4M3
// weight has positive block sizes and all its scales. Every backend calls it
// before touching memory.
func CheckMatMul(y, x []float32, w *Mat, n int) {
	if w == nil {
		panic(errNilWeight)
	}
	if n < 0 || w.Rows < 0 || w.Cols < 0 {
		panic(errNegative)
	}
	if len(x) < n*w.Cols {
		panic(errShortX)
	}
	if len(y) < n*w.Rows {
		panic(errShortY)
	}
	if w.DType.Size() == 0 && !w.DType.Quantized() {
		panic(errBadDType)
	}
	if w.Cols%w.DType.BlockElems() != 0 {
		panic(errPartBlock)
	}
	if len(w.Data) < w.Rows*w.DType.RowBytes(w.Cols) {
		panic(errShortData)
	}
	if w.DType == F8E4M3 {
		if w.BlockRows <= 0 || w.BlockCols <= 0 {
			panic(errBadBlock)
		}
		if len(w.Scale) < ceilDiv(w.Rows, w.BlockRows)*ceilDiv(w.Cols, w.BlockCols) {
			panic(errShortScales)
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// MatMulRef is the generic reference MatMul every backend is checked
// against: y (n, w.Rows) = x (n, w.Cols) · wᵀ. Each weight row is decoded
// with RowF32 (exact for F32/BF16/F16, GGML's float32 dequantization for the
// block-quantized types; for F8E4M3 the product with the block
// scale is rounded to float32, as a fused kernel would), each output is the
// float64 sum of the float64 products, rounded once to float32. It is slow
// and meant for tests.
func MatMulRef(y, x []float32, w *Mat, n int) {
	CheckMatMul(y, x, w, n)
	row := make([]float32, w.Cols)
	for j := range w.Rows {
		w.RowF32(row, j)
		for i := range n {
			xi := x[i*w.Cols : (i+1)*w.Cols]
			var sum float64
			for k, v := range row {
				sum += float64(xi[k]) * float64(v)
			}
			y[i*w.Rows+j] = float32(sum)
		}
	}
}
