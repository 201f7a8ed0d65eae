package weights

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// FuzzHeader feeds arbitrary bytes to the safetensors parser: it must
// return an error or a Set whose every tensor can be read back, never panic.
// Seeds: the header of a real checkpoint with its data cut short, and a
// small file written by WriteFile.
func FuzzHeader(f *testing.F) {
	for _, p := range []string{"../../testdata/models/qwen3/reference.safetensors", "../../testdata/models/llama/model.safetensors"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 4096)])
	}
	path := filepath.Join(f.TempDir(), "small.safetensors")
	ts := []WriteTensor{
		Encode("a", kernels.F32, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}),
		Encode("b", kernels.BF16, []int{4}, []float32{1, 2, 3, 4}),
	}
	if err := WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		f.Fatal(err)
	}
	small, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(small)
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := FromBytes("fuzz.safetensors", data)
		if err != nil {
			return
		}
		for _, name := range s.Names() {
			tn, err := s.Tensor(name)
			if err != nil {
				t.Fatalf("listed tensor %q: %v", name, err)
			}
			if tn.Numel() > 1<<20 {
				continue
			}
			if len(tn.Shape) == 2 {
				_, _ = s.Mat(name, tn.Shape[0], tn.Shape[1]) // an error is fine, a panic is not
			}
			_, _ = s.Float32(name)
		}
	})
}
