package linattn

// ParallelFunc calls fn on contiguous sub-ranges [lo, hi) that together cover
// [0, n) exactly once, possibly concurrently, and returns when every call has
// returned. kernels.Backend.Parallel satisfies it.
type ParallelFunc func(n int, fn func(lo, hi int))

// Serial is a ParallelFunc that runs fn(0, n) on the calling goroutine.
func Serial(n int, fn func(lo, hi int)) {
	if n > 0 {
		fn(0, n)
	}
}

func orSerial(p ParallelFunc) ParallelFunc {
	if p == nil {
		return Serial
	}
	return p
}
