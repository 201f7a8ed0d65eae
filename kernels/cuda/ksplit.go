//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"unsafe"
)

// The K-split products of decode batches (FERRITE_CUDA_GEMM_KSPLIT=1 for
// two parts, or =3 or =4 parts; off by default until measured). cuBLASLt tiles a product of 64–128 split
// rows (32–64 sequences) over the weight's rows, so the 4,096–6,144-row
// layers (o, down, q/k/v) run on a fraction of the multiprocessors and
// stream their weight at 2.1–2.8 TB/s (GPU run 1 of session 15), and its
// own split-K, with a reduction kernel over its workspace, measured slower
// still. Here such a product runs as one strided batch of P products,
// each over a P-th of K (cublasLtMatrixLayout's batch count and stride: P
// times the blocks, each streaming a P-th of the weight rows' columns),
// into P (2n, rows) parts of the products' scratch, which ferrite_add_halves
// adds into the first in place before the product's own epilogue (one
// launch more, two for 4 parts), the epilogue kernels unchanged. The sums
// differ from the one product's in their grouping only.

// Layout attributes (cublasLtMatrixLayoutAttribute_t).
const (
	layoutBatchCount  = 5 // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32
	layoutBatchStride = 6 // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64 elements
)

// kSplitMaxParts is the most parts a K-split product takes.
const kSplitMaxParts = 4

// kSplitMaxRows is the most weight rows a K-split product has: the decode
// layers that cuBLASLt leaves short of blocks (gate/up, 24,576 rows,
// streams at 3.5 TB/s as it is).
const kSplitMaxRows = 8192

// kSplitDefault is FERRITE_CUDA_GEMM_KSPLIT's parts: 1 means 2; 2 to
// kSplitMaxParts as given; 0 (off) otherwise.
func kSplitDefault() int {
	switch v := os.Getenv("FERRITE_CUDA_GEMM_KSPLIT"); v {
	case "1", "2":
		return 2
	case "3":
		return 3
	case "4":
		return 4
	}
	return 0
}

// SetKSplit sets the K-split products' parts (0: off) for the steps that
// follow and returns the previous setting.
func (b *Backend) SetKSplit(parts int) int {
	prev := b.kSplit
	b.kSplit = parts
	return prev
}

// kSplits returns the parts the split product of n rows with w runs in,
// or 0: on, cuBLASLt able to batch, a height it helps and parts of K at
// 16-byte addresses.
func (b *Backend) kSplits(w *Weight, n int) int {
	p := b.kSplit
	if p < 2 || lt.layoutSetAttr == 0 || w.Rows > kSplitMaxRows || w.Cols%(8*p) != 0 || 2*n > gemmTuneRows {
		return 0
	}
	return p
}

// batchLayout makes layout l a strided batch of parts matrices stride
// elements apart.
func batchLayout(l uintptr, parts int, stride int64) error {
	if lt.layoutSetAttr == 0 {
		return fmt.Errorf("cuda: cuBLASLt has no cublasLtMatrixLayoutSetAttribute")
	}
	cnt := int32(parts)
	if err := checkLt("cublasLtMatrixLayoutSetAttribute", call(lt.layoutSetAttr, l, layoutBatchCount, uintptr(unsafe.Pointer(&cnt)), 4)); err != nil {
		return err
	}
	return checkLt("cublasLtMatrixLayoutSetAttribute", call(lt.layoutSetAttr, l, layoutBatchStride, uintptr(unsafe.Pointer(&stride)), 8))
}

// gemmKSplitL runs on the device thread: t (parts·n, w.Rows) gets the
// products of x (n, w.Cols) and w over each of parts parts of K, part p at
// t + p·n·w.Rows, and then the parts are added into part 0, which holds
// the product: ferrite_add_halves in place, t₀ + t₁ for 2 parts, t₀ + (t₁
// + t₂) for 3, t₀ + (t₁ + (t₂ + t₃)) for 4.
func (d *Device) gemmKSplitL(t, x uint64, w *Weight, n, parts int) error {
	if d.trace != nil {
		*d.trace = append(*d.trace, traceGemm, t, x, w.Buf.ptr, uint64(n), uint64(w.Rows), uint64(w.Cols), uint64(1+parts))
	} else {
		b, err := d.blasLtL()
		if err != nil {
			return err
		}
		p, err := b.planParts(n, w.Rows, w.Cols, parts)
		if err != nil {
			return err
		}
		if err := d.matmulL(b, p, t, x, w, n, false); err != nil {
			return err
		}
	}
	cnt := int64(n) * int64(w.Rows)
	part := func(i int) uint64 { return t + uint64(i)*uint64(cnt)*4 }
	add := func(y, from uint64, acc bool) error { // y = from + from's next part (+ y)
		return d.launchL("ferrite_add_halves", d.elementwiseGrid(cnt), 256, 0, y, from, uint64(0), uint64(cnt), i32(w.Rows), b32(acc))
	}
	switch parts {
	case 2:
		return add(t, t, false)
	case 3:
		return add(t, part(1), true)
	}
	if err := add(part(2), part(2), false); err != nil {
		return err
	}
	return add(t, part(1), true)
}
