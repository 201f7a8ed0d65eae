package cpu

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.SampleOps = (*Backend)(nil)

// TopKRows implements kernels.SampleOps: one row per task, a bounded
// min-heap of the best columns seen (k = 1: a plain argmax scan).
func (b *Backend) TopKRows(out, logits kernels.Tensor) {
	k, v := out.Cols/2, logits.Cols
	if out.Rows != logits.Rows || out.Cols%2 != 0 || k < 1 || k > v || v > 1<<24 {
		panic("cpu: TopKRows: out must be (R, 2k) with 1 ≤ k ≤ V ≤ 2^24")
	}
	y, x := f32(out), f32(logits)
	b.Parallel(logits.Rows, func(lo, hi int) {
		heap := make([]cand, 0, k)
		for i := lo; i < hi; i++ {
			row, o := x[i*logits.Stride:i*logits.Stride+v], y[i*out.Stride:i*out.Stride+2*k]
			if k == 1 {
				c := argmaxRow(row)
				o[0], o[1] = ref.SampleKey(row[c]), float32(c)
				continue
			}
			heap = topKRow(heap, row, k)
			for j, c := range heap {
				o[j], o[k+j] = c.v, float32(c.col)
			}
		}
	})
}

// argmaxRow is the first column of row's largest value by ref.SampleKey.
func argmaxRow(row []float32) int {
	best, bv := 0, ref.SampleKey(row[0])
	for j, v := range row {
		if v > bv { // NaN never is; −0 and +0 tie, as the keys do
			best, bv = j, v
		}
	}
	return best
}

// cand is a TopKRows candidate: a key and its column.
type cand struct {
	v   float32
	col int32
}

// worse orders candidates: a lower key, then a higher column.
func (a cand) worse(b cand) bool { return a.v < b.v || a.v == b.v && a.col > b.col }

// topKRow returns in heap (reused) the k best candidates of row, best
// first. Columns come in increasing order, so a newcomer with the root's
// key never displaces it: one comparison per column in the common case.
func topKRow(heap []cand, row []float32, k int) []cand {
	heap = heap[:0]
	for j := range k {
		heap = append(heap, cand{ref.SampleKey(row[j]), int32(j)})
	}
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(heap, i)
	}
	for j := k; j < len(row); j++ {
		if v := row[j]; v > heap[0].v { // NaN: never
			heap[0] = cand{ref.SampleKey(v), int32(j)}
			siftDown(heap, 0)
		}
	}
	// Heap sort: the worst goes to the back, so the best ends up first.
	for n := len(heap) - 1; n > 0; n-- {
		heap[0], heap[n] = heap[n], heap[0]
		siftDown(heap[:n], 0)
	}
	return heap
}

// siftDown restores the min-heap order (the worst candidate at the root)
// below i.
func siftDown(h []cand, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].worse(h[l]) {
			m = r
		}
		if !h[m].worse(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

var _ kernels.DraftOps = (*Backend)(nil)

// FeedIDs implements kernels.DraftOps.
func (b *Backend) FeedIDs(dst, src, idx kernels.Tensor) {
	if dst.Cols != 1 || idx.Cols != 1 || idx.Rows != dst.Rows || !src.Contiguous() {
		panic("cpu: FeedIDs wants dst, idx (M, 1) and a contiguous src")
	}
	d, x, ix := i32(dst), f32(src), i32(idx)
	for i := range dst.Rows {
		if j := ix[i*idx.Stride]; j >= 0 && int(j) < src.Elems() {
			d[i*dst.Stride] = int32(x[j])
		}
	}
}
