//go:build linux && (amd64 || arm64)

package device

import (
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cuda"
)

// TestCUDABackendHasOpSet: the backend Open returns for cuda implements
// the op set, so --device cuda and auto run the op-set architectures
// (engine/gqa) on the GPU rather than falling back to the CPU.
func TestCUDABackendHasOpSet(t *testing.T) {
	var be kernels.Backend = (*cuda.Backend)(nil)
	if _, ok := be.(kernels.Device); !ok {
		t.Fatal("cuda.Backend does not implement kernels.Device")
	}
	b, err := Open(Spec{Kind: CUDA}, 1)
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	defer b.Close()
	if _, ok := b.Backend.(kernels.Device); !ok {
		t.Errorf("Open(cuda) returned %T, without the op set", b.Backend)
	}
}
