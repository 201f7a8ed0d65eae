package cpu

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Weight preparation. MatMul makes a weight's resident copy (resident.go)
// or x8 packing (x8.go) on the weight's first MatMul, and AttentionMLA a
// kv_b_proj's per-head split on its first absorbed call (mla.go), which
// puts the work of the whole model (0.5–2.7 s for Qwen3-0.6B in BF16 on two
// threads of a shared VM, most of it kernel time: the clearing of the fresh
// huge pages the copies go to, and for Q8_0 the faults of the packing's
// 4 KiB pages) into the first request. PrepareWeights makes them ahead
// of time, through the same caches and by the same rules, so a MatMul finds
// them made; the engine runs it on a goroutine of its own right after a
// model loads, while the chat opens and the user types.
//
// It runs beside the engine's steps, so it keeps away from what is the
// engine goroutine's alone: it works on goroutines of its own (spread), not
// on the worker pool, which one call holds at a time (a MatMul finding the
// pool held would run single-threaded), and it reads the backend's setting
// once, when called, from bf16xSet (bf16x is the engine goroutine's).
// Everything it shares with MatMul is the weight caches, whose per-weight
// once makes a weight's form exactly once:
// a MatMul of a weight being prepared waits for that copy instead of making
// a second one, and one of a weight not reached yet makes it itself (over
// the pool), which PrepareWeights then finds made.

// errClosed is PrepareWeights' error after Close.
var errClosed = errors.New("cpu: backend closed")

// PrepareWeights implements kernels.WeightPreparer: it makes, for each of
// ws in turn, the forms MatMul keeps of it, as a one-row MatMul (decode)
// would make them now: the x8 packing of a Q4_0 or Q8_0 weight, the resident
// copy of a BF16 weight on the VDPBF16PS path (x8Persistent, residentOK,
// residentBudget, FERRITE_CPU_RESIDENT=0 and FERRITE_CPU_X8=0 apply as in
// MatMul), and the per-head split of a kv_b_proj declared with its shape
// (DeclareKVB), as the first AttentionMLA in the absorbed form would make
// it (or, for one its file stores split, Mat.KVB, those parts' forms). ws
// holds no routed expert (MatMul keeps no Q8_0 or BF16 form of one). It stops, returning ctx.Err() (errClosed after Close), before the
// next weight once ctx is done or the backend closed. Call it after
// SetBF16Activations; it may run on any goroutine, beside the backend's
// ops.
func (b *Backend) PrepareWeights(ctx context.Context, ws []*kernels.Mat) error {
	bf16x, nw := b.bf16xSet.Load(), b.pool.workers
	split := func(n int, fn func(lo, hi int)) { spread(nw, n, fn) }
	for i, w := range ws {
		if i > 0 && prepHook != nil {
			prepHook(i - 1)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		select {
		case <-b.pool.quit:
			return errClosed
		default:
		}
		if w == nil || w.Data == nil { // a Random matrix left for a backend that generates it
			continue
		}
		b.x8.packed(w, split, false)
		b.res.data(w, bf16Path(w, 1, bf16x), false, split)
		b.mla.prepare(w)
		if hs := w.KVB; hs != nil { // a kv_b_proj's parts as its file stores them: the absorbed form's matrices
			for _, p := range append(slices.Clip(hs.UK), hs.UV...) {
				b.x8.packed(p, split, false)
				b.res.data(p, bf16Path(p, 1, bf16x), false, split)
			}
		}
	}
	return nil
}

// HasCopy implements kernels.WeightCopier: whether w has a resident copy
// (resident.go), made by PrepareWeights or a MatMul.
func (b *Backend) HasCopy(w *kernels.Mat) bool {
	d, ok := b.res.peek(w)
	return ok && d != nil
}

// prepHook, when set (tests), is called after PrepareWeights' weight i.
var prepHook func(i int)

// spread calls fn on min(n, nw) contiguous sub-ranges that together cover
// [0, n), concurrently on goroutines of its own and the caller's, and
// returns when all have returned: Parallel without the pool. A panic in fn
// is re-raised on the caller after the others have returned.
func spread(nw, n int, fn func(lo, hi int)) {
	nw = min(nw, n)
	if nw <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed any
	)
	for w := 1; w < nw; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					mu.Lock()
					failed = r
					mu.Unlock()
				}
			}()
			fn(w*n/nw, (w+1)*n/nw)
		}()
	}
	func() {
		defer wg.Wait()
		fn(0, n/nw)
	}()
	if failed != nil {
		panic(failed)
	}
}
