package gguf

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestGGUFPyFile reads testdata/gguf-py.gguf, written by llama.cpp's own
// writer (tools/ggufref/make_reference.py), and checks every value against
// what the script recorded.
func TestGGUFPyFile(t *testing.T) {
	m, err := Open(filepath.Join("testdata", "gguf-py.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	data, err := os.ReadFile(filepath.Join("testdata", "gguf-py.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Tensors map[string]struct {
			Shape  []int
			Values []float32
		}
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	meta := m.Meta
	if meta.Arch() != "llama" || meta.FileType() != "Q8_0" || meta.String("t.str") != "héllo ✓" {
		t.Errorf("arch %q, file type %q, str %q", meta.Arch(), meta.FileType(), meta.String("t.str"))
	}
	for k, want := range map[string]int64{"t.u8": 200, "t.i8": -5, "t.u16": 60000, "t.i16": -300, "t.u32": 4000000000, "t.i32": -70000, "t.i64": -1 << 40} {
		if v, _ := meta.Get(k); true {
			if got, ok := v.Int(); !ok || got != want {
				t.Errorf("%s = %d, want %d", k, got, want)
			}
		}
	}
	if v, _ := meta.Get("t.u64"); true {
		if u, ok := v.Uint(); !ok || u != 1<<63 {
			t.Errorf("t.u64 = %d", u)
		}
	}
	for k, want := range map[string]float64{"t.f32": 1.5, "t.f64": 2.25} {
		if v, _ := meta.Get(k); true {
			if f, ok := v.Float(); !ok || f != want {
				t.Errorf("%s = %g", k, f)
			}
		}
	}
	if v, _ := meta.Get("t.bool"); true {
		if b, ok := v.Bool(); !ok || !b {
			t.Error("t.bool")
		}
	}
	v, _ := meta.Get("t.strs")
	if s, ok := v.Strings(); !ok || !slices.Equal(s, []string{"a", "", "ccc"}) {
		t.Errorf("t.strs = %q", s)
	}
	v, _ = meta.Get("t.ints")
	if s, ok := v.Ints(); !ok || !slices.Equal(s, []int64{1, -2, 3}) {
		t.Errorf("t.ints = %v", s)
	}
	v, _ = meta.Get("t.floats")
	if s, ok := v.Floats(); !ok || !slices.Equal(s, []float64{0.5, -1}) {
		t.Errorf("t.floats = %v", s)
	}

	for name, r := range ref.Tensors {
		x, ok := m.Tensor(name)
		if !ok || !slices.Equal(x.Shape(), r.Shape) {
			t.Fatalf("%s: shape %v, want %v", name, x.Shape(), r.Shape)
		}
		if x.Offset%64 != 0 {
			t.Errorf("%s: offset %d not 64-aligned", name, x.Offset)
		}
		kd, ok := x.Type.DType()
		if !ok {
			t.Fatalf("%s: type %s", name, x.Type)
		}
		got := decodeRef(kd, x.Data, x.Numel())
		if !slices.Equal(got, r.Values) {
			t.Errorf("%s (%s): %v\nwant %v", name, x.Type, got, r.Values)
		}
	}
}

// decodeRef decodes F32, F16 and (GGML's block layout: an f16 scale, 32
// int8) Q8_0 data, independently of the kernels' conversions.
func decodeRef(kd kernels.DType, b []byte, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		switch kd {
		case kernels.F32:
			out[i] = f32At(b, i)
		case kernels.F16:
			out[i] = kernels.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		case kernels.Q8_0:
			blk := b[i/32*34:]
			out[i] = kernels.F16ToF32(binary.LittleEndian.Uint16(blk)) * float32(int8(blk[2+i%32]))
		}
	}
	return out
}
