package nn

import "github.com/ferrite-llm/ferrite/kernels/ref"

// Dot is Σ a[i]·b[i] over len(a) values, with four float32 accumulators.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Axpy sets y += alpha·x over len(x) values.
func Axpy(y []float32, alpha float32, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// Silu is x·sigmoid(x) (ref.Silu).
func Silu(x float32) float32 { return ref.Silu(x) }

// Sigmoid is 1/(1+e^-x) (ref.Sigmoid).
func Sigmoid(x float32) float32 { return ref.Sigmoid(x) }

// Softmax replaces x with softmax(x), max-subtracted with a float64 sum
// (ref.Softmax).
func Softmax(x []float32) { ref.Softmax(x) }
