//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"unsafe"
)

// The K-split products of decode batches (FERRITE_CUDA_GEMM_KSPLIT=1, off
// by default until measured). cuBLASLt tiles a product of 64–128 split
// rows (32–64 sequences) over the weight's rows, so the 4,096–6,144-row
// layers (o, down, q/k/v) run on a fraction of the multiprocessors and
// stream their weight at 2.1–2.8 TB/s (GPU run 1 of session 15), and its
// own split-K, with a reduction kernel over its workspace, measured slower
// still. Here such a product runs as one strided batch of two products,
// each over half of K (cublasLtMatrixLayout's batch count and stride: twice
// the blocks, each streaming half the weight rows' columns), into two
// (2n, rows) halves of the products' scratch, which ferrite_add_halves
// adds in place before the product's own epilogue: one launch more, and
// the epilogue kernels unchanged. The sums differ from the one product's
// in their grouping only.

// Layout attributes (cublasLtMatrixLayoutAttribute_t).
const (
	layoutBatchCount  = 5 // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32
	layoutBatchStride = 6 // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64 elements
)

// kSplitParts is the parts a K-split product takes.
const kSplitParts = 2

// kSplitMaxRows is the most weight rows a K-split product has: the decode
// layers that cuBLASLt leaves short of blocks (gate/up, 24,576 rows,
// streams at 3.5 TB/s as it is).
const kSplitMaxRows = 8192

// kSplitDefault is FERRITE_CUDA_GEMM_KSPLIT=1.
func kSplitDefault() bool { return os.Getenv("FERRITE_CUDA_GEMM_KSPLIT") == "1" }

// SetKSplit turns the K-split products on or off for the steps that follow
// and returns the previous setting.
func (b *Backend) SetKSplit(on bool) bool {
	prev := b.kSplit
	b.kSplit = on
	return prev
}

// kSplits reports whether the split product of n rows with w runs K-split:
// on, cuBLASLt able to batch, a height it helps and halves of K at 16-byte
// addresses.
func (b *Backend) kSplits(w *Weight, n int) bool {
	return b.kSplit && lt.layoutSetAttr != 0 && w.Rows <= kSplitMaxRows && w.Cols%(8*kSplitParts) == 0 && 2*n <= gemmTuneRows
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

// gemmKSplitL runs on the device thread: t (kSplitParts·n, w.Rows) gets
// the products of x (n, w.Cols) and w over each part of K, part p at
// t + p·n·w.Rows, and then part 1 is added into part 0
// (ferrite_add_halves in place), which holds the product.
func (d *Device) gemmKSplitL(t, x uint64, w *Weight, n int) error {
	if d.trace != nil {
		*d.trace = append(*d.trace, traceGemm, t, x, w.Buf.ptr, uint64(n), uint64(w.Rows), uint64(w.Cols), kSplitParts)
	} else {
		b, err := d.blasLtL()
		if err != nil {
			return err
		}
		p, err := b.planParts(n, w.Rows, w.Cols, kSplitParts)
		if err != nil {
			return err
		}
		if err := d.matmulL(b, p, t, x, w, n, false); err != nil {
			return err
		}
	}
	cnt := int64(n) * int64(w.Rows)
	return d.launchL("ferrite_add_halves", d.elementwiseGrid(cnt), 256, 0, t, t, uint64(0), uint64(cnt), i32(w.Rows), b32(false))
}
