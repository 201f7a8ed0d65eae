package engine

import (
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// bf16Recorder is the CPU backend, recording what the engine allows for
// bfloat16 activations.
type bf16Recorder struct {
	*cpu.Backend
	set, on bool
}

func (b *bf16Recorder) SetBF16Activations(on bool) {
	b.set, b.on = true, on
	b.Backend.SetBF16Activations(on)
}

// TestBF16ActivationsFollowCache: the backend may round x to bfloat16
// exactly when the model keeps a bfloat16 KV cache (qwen3's default), not
// with a float32 one, in any architecture.
func TestBF16ActivationsFollowCache(t *testing.T) {
	for _, c := range []struct {
		name string
		kv32 bool
		want bool
	}{{"qwen3-bf16", false, true}, {"qwen3-bf16", true, false}, {"llama", true, false}} {
		b := &bf16Recorder{Backend: cpu.New(1)}
		l, err := Load(fixtures.Dir(c.name), Options{Threads: 1, KVFloat32: c.kv32, Backend: b})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		l.Close()
		b.Close()
		if !b.set || b.on != c.want {
			t.Errorf("%s kv-f32=%v: SetBF16Activations called %v with %v, want %v", c.name, c.kv32, b.set, b.on, c.want)
		}
	}
}
