package kernels

// Backend runs the engine's heavy operations. Activations are float32 host
// slices; weights are Mats in their stored dtype, converted inside the kernel.
// Implementations must be safe for use by one engine goroutine at a time.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda").
	Name() string

	// MatMul sets y = x·wᵀ for n rows: x is (n, w.Cols), y is (n, w.Rows).
	MatMul(y, x []float32, w *Mat, n int)

	// Parallel calls fn on contiguous sub-ranges of [0, n) spread over the
	// backend's workers and returns when all calls have returned.
	Parallel(n int, fn func(lo, hi int))
}
