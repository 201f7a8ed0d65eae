// Package device chooses the compute backend a model runs on, from a spec
// the user writes (--device, [engine] device): "cpu", "cuda" or "cuda:N"
// for GPU N, or "auto" (the default), which takes GPU 0 when an NVIDIA
// driver and a GPU of compute capability 8.0 or newer are found and the CPU
// otherwise, and says which it took and why.
package device

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// Kind is the kind of device a Spec asks for.
type Kind string

const (
	Auto Kind = "auto"
	CPU  Kind = "cpu"
	CUDA Kind = "cuda"
)

// Spec is a parsed device choice.
type Spec struct {
	Kind    Kind
	Ordinal int // the GPU, for CUDA
}

func (s Spec) String() string {
	if s.Kind == CUDA {
		return fmt.Sprintf("cuda:%d", s.Ordinal)
	}
	return string(s.Kind)
}

// Parse reads "auto", "cpu", "cuda" or "cuda:N"; "" means auto.
func Parse(s string) (Spec, error) {
	switch s = strings.ToLower(strings.TrimSpace(s)); s {
	case "", "auto":
		return Spec{Kind: Auto}, nil
	case "cpu":
		return Spec{Kind: CPU}, nil
	case "cuda":
		return Spec{Kind: CUDA}, nil
	}
	if rest, ok := strings.CutPrefix(s, "cuda:"); ok {
		if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
			return Spec{Kind: CUDA, Ordinal: n}, nil
		}
	}
	return Spec{}, fmt.Errorf("device %q: want auto, cpu, cuda or cuda:N", s)
}

// Backend is an opened device: the kernels.Backend to run on, what it is,
// and how to let it go.
type Backend struct {
	kernels.Backend
	// Desc says what runs the model: "cpu (16 threads)" or
	// "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139 GiB)".
	Desc string
	// Note says why auto chose the CPU ("no GPU: ..."); empty otherwise.
	Note  string
	close func() error
}

// Threads is the number of CPU workers the backend's Parallel uses.
func (b *Backend) Threads() int {
	if t, ok := b.Backend.(interface{ Threads() int }); ok {
		return t.Threads()
	}
	return 1
}

// Err returns the failure that made the backend's results invalid (a GPU's
// sticky error, which kernels.Backend's MatMul cannot return), or nil.
func (b *Backend) Err() error {
	if f, ok := b.Backend.(interface{ Err() error }); ok {
		return f.Err()
	}
	return nil
}

// Close releases the backend (worker goroutines, device memory).
func (b *Backend) Close() error {
	if b.close == nil {
		return nil
	}
	c := b.close
	b.close = nil
	return c()
}

// Open opens the device s names with threads CPU workers (≤ 0: one per
// CPU; a GPU backend uses them for host-side loops). An explicit cuda spec
// fails with a one-line error where no usable GPU is found; auto falls back
// to the CPU and says why in Note.
func Open(s Spec, threads int) (*Backend, error) {
	if s.Kind == CUDA || s.Kind == Auto {
		b, err := openCUDA(s.Ordinal, threads)
		if err == nil {
			return b, nil
		}
		if s.Kind == CUDA {
			return nil, err
		}
		c := openCPU(threads)
		c.Note = "no GPU: " + strings.TrimPrefix(err.Error(), "cuda: ")
		return c, nil
	}
	return openCPU(threads), nil
}

func openCPU(threads int) *Backend {
	c := cpu.New(threads)
	desc := fmt.Sprintf("cpu (%d threads)", c.Threads())
	if c.Threads() == 1 {
		desc = "cpu (1 thread)"
	}
	return &Backend{Backend: c, Desc: desc, close: func() error { c.Close(); return nil }}
}
