package cpu

import (
	"os"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Resident weights. A decode step streams every weight matrix from memory
// once, and the weights of a model file lie where the engine put them: in
// the file's mapping, in 4 KiB pages of the page cache. Streaming 4 KiB
// pages costs a TLB miss per page (a step of Qwen3-0.6B BF16 reads 290,000
// of them) and stops the hardware prefetchers at every page boundary, so
// MatMul keeps a BF16 weight it multiplies on the VDPBF16PS path copied
// once into memory backed by transparent huge pages (residentCache; as much memory again as those weights, which then are no
// longer read by MatMul), as it keeps Q4_0 and Q8_0 weights repacked
// (x8Cache). One Zen 5 core streams the gemv kernel over 1 GiB of weights
// at 39.6 GB/s of its CPU time from huge pages against 29.7 from the file's
// mapping with the prefetching kernel decode used (medians of 7 passes,
// interleaved; BenchmarkGemvPlacement compares heap and huge pages), and
// without software prefetch (gemvHuge) rather than with. A routed expert's
// weights are not copied, to bound the memory, nor any beyond
// residentBudget (residentFits). FERRITE_CPU_RESIDENT=0 turns the copies
// off; FERRITE_CPU_HUGEPAGES=0 keeps them (and large tensors) in 4 KiB
// pages (hugeBytes). A copy is made once per weight (weightCache): by
// PrepareWeights, which the engine runs after a load (prepare.go), or else
// by the weight's first MatMul, which waits for one PrepareWeights has
// begun.

// residentOff turns resident copies off (FERRITE_CPU_RESIDENT=0 in the
// environment), so one build can run both.
var residentOff atomic.Bool

func init() { residentOff.Store(os.Getenv("FERRITE_CPU_RESIDENT") == "0") }

// residentBudget is the most bytes of resident copies a backend keeps: a
// quarter of the machine's memory (the file's pages stay in the page
// cache beside them until the kernel needs the room). A copy is also
// skipped when it would take more than half the memory available
// (MemAvailable) at the time.
var residentBudget = func() int64 {
	if m := meminfo("MemTotal"); m > 0 {
		return m / 4
	}
	return 4 << 30
}()

// residentFits reports whether a copy of n more bytes stays within
// residentBudget (held bytes already) and half the available memory.
func residentFits(held, n int64) bool {
	if held+n > residentBudget {
		return false
	}
	avail := meminfo("MemAvailable")
	return avail == 0 || n <= avail/2
}

// residentCache holds the resident copies, per matrix; a matrix's is nil
// where none was made (out of budget).
type residentCache struct{ weightCache[[]byte] }

// residentOK reports whether MatMul keeps a resident copy of w on path:
// BF16 weights on the VDPBF16PS path, not Transient, not a routed
// expert's.
func residentOK(w *kernels.Mat, path int, expert bool) bool {
	return path == pathBF16 && w.DType == kernels.BF16 && !w.Transient && !expert && !residentOff.Load() &&
		len(w.Data) >= 1<<20
}

// data returns w's resident copy, copying it on first use (over the
// workers with copyFn), or nil when w has none.
func (c *residentCache) data(w *kernels.Mat, path int, expert bool, copyFn func(n int, fn func(lo, hi int))) []byte {
	if !residentOK(w, path, expert) {
		return nil
	}
	return c.get(w, func() ([]byte, int64) {
		n := len(w.Data)
		if !residentFits(c.bytes.Load(), int64(n)) {
			return nil, 0
		}
		d := hugeBytes(n)
		const chunk = 1 << 20
		copyFn((n+chunk-1)/chunk, func(lo, hi int) {
			copy(d[lo*chunk:min(n, hi*chunk)], w.Data[lo*chunk:min(n, hi*chunk)])
		})
		return d, int64(n)
	})
}
