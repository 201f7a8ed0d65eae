//go:build linux && (amd64 || arm64)

package cuda

import (
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// ReadI32 copies t (I32, len(dst) = t.Elems()) into host memory once the
// queued work has run, like ReadF32: the k-pool selections read back by
// tests (kernels/kerneltest). After a device failure dst is filled with −1.
// (s11-mla's kernels.SparseOps has the same method in mla.go: this file goes
// when both are merged.)
func (b *Backend) ReadI32(dst []int32, t kernels.Tensor) {
	if t.DType != kernels.I32 || len(dst) != t.Elems() {
		panic("cuda: ReadI32 wants an I32 tensor of len(dst) elements")
	}
	var raw []byte
	if len(dst) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst))
	}
	if !b.read(raw, t) {
		for i := range dst {
			dst[i] = -1
		}
	}
}
