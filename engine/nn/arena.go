package nn

// Arena hands out float32 scratch slices for one forward pass without
// allocating in steady state. It is a bump allocator over one buffer: Mark
// and Release free everything handed out after a mark, and Reset frees all
// and grows the buffer to the largest size the last pass needed. It is not
// safe for concurrent use; take slices before a parallel section.
type Arena struct {
	buf  []float32
	off  int // next free index in buf
	over int // values handed out by separate allocations since Reset
	peak int // highest off+over seen since Reset
}

// Reset releases every slice and makes the buffer big enough for the
// largest demand seen so far.
func (a *Arena) Reset() {
	if a.peak > len(a.buf) {
		a.buf = make([]float32, a.peak+a.peak/4)
	}
	a.off, a.over, a.peak = 0, 0, 0
}

// Get returns n values with unspecified contents.
func (a *Arena) Get(n int) []float32 {
	var s []float32
	if a.off+n <= len(a.buf) {
		s = a.buf[a.off : a.off+n : a.off+n]
		a.off += n
	} else {
		s = make([]float32, n)
		a.over += n
	}
	a.peak = max(a.peak, a.off+a.over)
	return s
}

// Mark records the arena's position for Release.
func (a *Arena) Mark() int { return a.off }

// Release frees every buffer slice handed out since Mark returned m.
func (a *Arena) Release(m int) { a.off = m }
