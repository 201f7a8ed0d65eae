package kernels

import "errors"

// ErrFreed is the panic value of a backend that notices a tensor used, or
// freed again, after Memory.Free released its storage.
var ErrFreed = errors.New("kernels: tensor used after Memory.Free released it")

// MemoryUse is the memory a backend holds, in bytes: what the chat's status
// bar, /stats and ferrite bench report. KV cache and recurrent state are in
// Tensors; their own pools know their sizes (kvcache.Cache, linattn's
// StatePool), so the split is worked out by the caller, not by tagging
// allocations.
type MemoryUse struct {
	// OnDevice says the numbers are a device's own memory (a GPU's), not
	// host RAM.
	OnDevice bool
	// Weights is the weights held in the backend's memory: a GPU's
	// uploaded copies. A host backend uses the model's weights where they
	// are (mapped or converted in RAM) and reports only the copies it made
	// of them (the CPU's repacked Q4_0/Q8_0 weights).
	Weights int64
	// Tensors is the persistent tensors from Alloc: the KV cache, the
	// recurrent state, and the model's small buffers (indices, norms).
	Tensors int64
	// Arena is the capacity of the per-step Scratch arena.
	Arena int64
	// Total and Free are the device's memory as its driver reports it (all
	// processes); 0 when unknown (host backends, or a driver without the
	// call).
	Total, Free int64
}

// Used is the bytes the backend holds: weights, tensors and arena.
func (u MemoryUse) Used() int64 { return u.Weights + u.Tensors + u.Arena }

// MemoryReporter is an optional capability of a Backend: it reports what
// it holds. It is cheap enough to call after every step.
type MemoryReporter interface {
	MemoryUse() MemoryUse
}

// BatchSizer is an optional capability of a Device: the token budget of
// one engine step (decode tokens plus prompt chunks) it runs best at. A GPU
// needs thousands of prompt rows a step to keep its tensor cores busy; a
// device without it gets the runtime's default.
type BatchSizer interface {
	PreferredBatchTokens() int
}

// BatchReader is an optional capability of a Memory whose reads each wait
// for the device (a GPU's): ReadF32s reads several F32 tensors after one
// wait, dst[i] getting ts[i] as ReadF32 would give it.
type BatchReader interface {
	ReadF32s(dst [][]float32, ts []Tensor)
}

// ReadF32s reads each ts[i] into dst[i] on m: in one wait when m is a
// BatchReader, one ReadF32 at a time otherwise.
func ReadF32s(m Memory, dst [][]float32, ts []Tensor) {
	if br, ok := m.(BatchReader); ok {
		br.ReadF32s(dst, ts)
		return
	}
	for i, t := range ts {
		m.ReadF32(dst[i], t)
	}
}
