// Package cuda is ferrite's NVIDIA GPU backend. It binds the CUDA driver API
// (libcuda.so.1) and cuBLASLt at run time with github.com/ebitengine/purego,
// so builds stay CGO_ENABLED=0 and a binary runs unchanged on machines with
// no GPU: Open then returns an error and callers use the CPU.
//
// A Device owns one GPU: its primary context is current on one locked OS
// thread, a goroutine that runs every driver call in order. Device memory
// is a Buffer, freed explicitly (there are no finalizers); host copies go
// through fixed pinned staging buffers; kernel launch arguments live in a
// pinned block. Every failure is a Go error naming the CUresult (or the
// cuBLAS status); a sticky error such as an illegal address marks the
// Device dead, and every later call returns that error instead of crashing.
//
// The kernels are CUDA C++ in src/, built by tools/cuda/build_fatbin.sh into
// ferrite.fatbin (sm_90a machine code plus compute_80 PTX), embedded and
// loaded with cuModuleLoadData; fatbin.sha256 pins the sources it was built
// from; tools/cuda/check_cuda.sh type-checks them with clang where there is
// no nvcc. Backend implements the op set (kernels.Device) on a Device:
// tensors in device memory, a per-step scratch arena, launches queued and
// handed to the device thread in batches, each weight uploaded once per
// *kernels.Mat (a kernels.Mat.Random one without Data generated in device
// memory instead: the bytes engine/randweights makes on the host). It also implements the host-slice kernels.Backend, copying
// activations for every MatMul, for the architectures not on the op set.
package cuda
