package kernels

import "io"

// Profiler is implemented by backends that can time their device work per
// kernel (the CUDA backend when FERRITE_CUDA_PROFILE=1). Benchmarks
// type-assert it; backends without a profiler need not implement it.
type Profiler interface {
	// Profiling reports whether the backend is timing its work.
	Profiling() bool
	// ResetProfile forgets the times and steps counted so far.
	ResetProfile()
	// WriteProfile waits for queued work and writes the per-kernel table
	// (label, calls, calls per step, µs per call, µs per step, share of
	// the total, and the sum) to w.
	WriteProfile(w io.Writer) error
}
