//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"unsafe"
)

// Buffer is a span of device memory. It stays allocated until Free (or the
// Device's Close): the garbage collector never frees it.
type Buffer struct {
	dev  *Device
	ptr  uint64 // CUdeviceptr
	size int64  // bytes
}

// Ptr is the buffer's device address.
func (b *Buffer) Ptr() uint64 { return b.ptr }

// Size is the buffer's length in bytes.
func (b *Buffer) Size() int64 { return b.size }

// Alloc returns size bytes of uninitialised device memory (size > 0).
func (d *Device) Alloc(size int64) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: Alloc of %d bytes", size)
	}
	var b *Buffer
	err := d.do(func() error {
		var err error
		b, err = d.allocL(size)
		return err
	})
	return b, err
}

func (d *Device) allocL(size int64) (*Buffer, error) {
	var p uint64
	if err := check("cuMemAlloc", call(driver.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size))); err != nil {
		return nil, fmt.Errorf("%w (%d MiB asked for)", err, size>>20)
	}
	b := &Buffer{dev: d, ptr: p, size: size}
	d.live[b] = struct{}{}
	return b, nil
}

// Free releases the buffer's memory; freeing twice is a no-op.
func (b *Buffer) Free() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	return b.dev.do(b.free)
}

func (b *Buffer) free() error {
	if b.ptr == 0 {
		return nil
	}
	delete(b.dev.live, b)
	p := b.ptr
	b.ptr = 0
	if b.dev.dead != nil {
		return nil // the context is gone; so is its memory
	}
	return check("cuMemFree", call(driver.cuMemFree, uintptr(p)))
}

// span checks that [off, off+n) lies inside b.
func (b *Buffer) span(off, n int64) error {
	if b == nil || b.ptr == 0 {
		return fmt.Errorf("cuda: use of a freed or nil Buffer")
	}
	if off < 0 || n < 0 || off+n > b.size {
		return fmt.Errorf("cuda: bytes [%d, %d) outside a %d-byte Buffer", off, off+n, b.size)
	}
	return nil
}

// Upload copies src into b at byte offset off through the pinned staging
// buffer, and returns when the copy is done.
func (b *Buffer) Upload(off int64, src []byte) error {
	if err := b.span(off, int64(len(src))); err != nil {
		return err
	}
	return b.dev.do(func() error { return b.dev.uploadL(b.ptr+uint64(off), src) })
}

// Download copies len(dst) bytes of b from byte offset off into dst.
func (b *Buffer) Download(dst []byte, off int64) error {
	if err := b.span(off, int64(len(dst))); err != nil {
		return err
	}
	return b.dev.do(func() error { return b.dev.downloadL(dst, b.ptr+uint64(off)) })
}

// UploadF32 copies src into b at element offset off (float32 elements).
func (b *Buffer) UploadF32(off int, src []float32) error {
	return b.Upload(int64(off)*4, f32Bytes(src))
}

// DownloadF32 copies len(dst) float32 elements of b from element off.
func (b *Buffer) DownloadF32(dst []float32, off int) error {
	return b.Download(f32Bytes(dst), int64(off)*4)
}

func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// uploadL copies src to device address dst in staging-sized chunks and
// returns when the copies are done.
func (d *Device) uploadL(dst uint64, src []byte) error {
	if d.stageInOff > 0 {
		// Queued uploadAsyncL copies may still read the staging buffer.
		if err := d.syncL(); err != nil {
			return err
		}
	}
	for len(src) > 0 {
		n := copy(d.stageIn, src)
		if err := d.profiledL(profKey{kind: profHtoD, size: int64(n)}, func() error {
			return check("cuMemcpyHtoDAsync", call(driver.cuMemcpyHtoDAsync, uintptr(dst),
				uintptr(unsafe.Pointer(&d.stageIn[0])), uintptr(n), d.stream))
		}); err != nil {
			return err
		}
		if err := d.syncL(); err != nil {
			return err
		}
		src, dst = src[n:], dst+uint64(n)
	}
	return nil
}

// uploadAsyncL queues a copy of src (at most stagingBytes) to device
// address dst on the stream and returns without waiting: src goes into the
// next free bytes of the pinned staging buffer, which the copy reads when
// the stream reaches it. Every successful syncL frees the whole buffer
// again (the stream has run the copies); when src does not fit in what is
// left, uploadAsyncL waits for the stream first.
func (d *Device) uploadAsyncL(dst uint64, src []byte) error {
	n := len(src)
	if n == 0 {
		return nil
	}
	if n > len(d.stageIn) {
		return d.uploadL(dst, src)
	}
	off := int(alignUp(int64(d.stageInOff), 256))
	if off+n > len(d.stageIn) {
		if err := d.syncL(); err != nil {
			return err
		}
		off = 0
	}
	copy(d.stageIn[off:], src)
	if err := d.profiledL(profKey{kind: profHtoD, size: int64(n)}, func() error {
		return check("cuMemcpyHtoDAsync", call(driver.cuMemcpyHtoDAsync, uintptr(dst),
			uintptr(unsafe.Pointer(&d.stageIn[off])), uintptr(n), d.stream))
	}); err != nil {
		return err
	}
	d.stageInOff = off + n
	return nil
}

// downloadsL copies from device addresses src[i] into dst[i], waiting for
// queued work once: when they fit in the staging buffer together, every
// copy is queued and the stream synchronised once; otherwise one by one
// (downloadL).
func (d *Device) downloadsL(dst [][]byte, src []uint64) error {
	total := 0
	for _, b := range dst {
		total += int(alignUp(int64(len(b)), 256))
	}
	if total > len(d.stageOut) {
		for i := range dst {
			if err := d.downloadL(dst[i], src[i]); err != nil {
				return err
			}
		}
		return nil
	}
	off := 0
	for i, b := range dst {
		if len(b) == 0 {
			continue
		}
		if err := d.profiledL(profKey{kind: profDtoH, size: int64(len(b))}, func() error {
			return check("cuMemcpyDtoHAsync", call(driver.cuMemcpyDtoHAsync,
				uintptr(unsafe.Pointer(&d.stageOut[off])), uintptr(src[i]), uintptr(len(b)), d.stream))
		}); err != nil {
			return err
		}
		off += int(alignUp(int64(len(b)), 256))
	}
	if err := d.syncL(); err != nil {
		return err
	}
	off = 0
	for _, b := range dst {
		copy(b, d.stageOut[off:])
		off += int(alignUp(int64(len(b)), 256))
	}
	return nil
}

// downloadL copies from device address src into dst in staging-sized
// chunks, waiting for queued work first (the copies are on the same stream).
func (d *Device) downloadL(dst []byte, src uint64) error {
	for len(dst) > 0 {
		n := min(len(dst), len(d.stageOut))
		if err := d.profiledL(profKey{kind: profDtoH, size: int64(n)}, func() error {
			return check("cuMemcpyDtoHAsync", call(driver.cuMemcpyDtoHAsync,
				uintptr(unsafe.Pointer(&d.stageOut[0])), uintptr(src), uintptr(n), d.stream))
		}); err != nil {
			return err
		}
		if err := d.syncL(); err != nil {
			return err
		}
		copy(dst, d.stageOut[:n])
		dst, src = dst[n:], src+uint64(n)
	}
	return nil
}

// Fill32 sets n 32-bit words of b from word offset off to the bit pattern v
// (queued; used to poison outputs in tests).
func (b *Buffer) Fill32(off, n int, v uint32) error {
	if err := b.span(int64(off)*4, int64(n)*4); err != nil {
		return err
	}
	return b.dev.do(func() error {
		return b.dev.profiledL(profKey{kind: profMemset, size: int64(4 * n)}, func() error {
			return check("cuMemsetD32Async", call(driver.cuMemsetD32Async, uintptr(b.ptr+uint64(off)*4), uintptr(v), uintptr(n), b.dev.stream))
		})
	})
}
