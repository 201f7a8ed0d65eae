package ref

import "math"

// SampleKey is a logit as kernels.SampleOps.TopKRows orders it: NaN as −∞
// and −0 as +0, so that equal keys are equal floats.
func SampleKey(v float32) float32 {
	switch {
	case v != v:
		return float32(math.Inf(-1))
	case v == 0:
		return 0
	}
	return v
}

// TopKRow sets vals and cols (k each, k ≤ len(row)) to the k best entries
// of row by SampleKey, best first, ties to the lower column
// (kernels.SampleOps.TopKRows).
func TopKRow(vals []float32, cols []int32, row []float32) {
	keys := make([]float32, len(row))
	for i, v := range row {
		keys[i] = SampleKey(v)
	}
	TopK(cols, keys) // no NaN left: rank's order is the float order, stable
	for i, c := range cols {
		vals[i] = keys[c]
	}
}
