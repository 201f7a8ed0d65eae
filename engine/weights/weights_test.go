package weights

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// vals returns n float32 values that every kernel dtype represents exactly:
// F8_E4M3 values in (-8, 8).
func vals(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = kernels.F8E4M3ToF32(uint8(r.IntN(0x50)) | uint8(r.IntN(2))<<7)
	}
	return v
}

func rawBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeRaw writes a safetensors file with the given header text and data.
func writeRaw(t *testing.T, path, header string, data []byte) {
	t.Helper()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	b := append(append(n[:], header...), data...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path string, ts []WriteTensor, meta map[string]string) {
	t.Helper()
	if err := WriteFile(path, ts, meta); err != nil {
		t.Fatal(err)
	}
}

func mustOpen(t *testing.T, dir string) *Set {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRoundTrip(t *testing.T) {
	type tc struct {
		w      WriteTensor
		kd     kernels.DType
		floats []float32 // what Float32 must return; nil if it must fail
	}
	f64 := make([]byte, 8*3)
	for i, v := range []float64{1.5, -2.25, 1e-3} {
		binary.LittleEndian.PutUint64(f64[8*i:], math.Float64bits(v))
	}
	cases := []tc{
		{Encode("a.f32", kernels.F32, []int{3, 5}, vals(15, 1)), kernels.F32, vals(15, 1)},
		{Encode("b.bf16", kernels.BF16, []int{4, 6}, vals(24, 2)), kernels.BF16, vals(24, 2)},
		{Encode("c.f16", kernels.F16, []int{2, 7}, vals(14, 3)), kernels.F16, vals(14, 3)},
		{Encode("d.f8", kernels.F8E4M3, []int{5, 3}, vals(15, 4)), kernels.F8E4M3, vals(15, 4)},
		{Encode("e.scalar", kernels.F32, nil, []float32{2.5}), kernels.F32, []float32{2.5}},
		{Encode("f.vec", kernels.BF16, []int{9}, vals(9, 5)), kernels.BF16, vals(9, 5)},
		{Encode("g.empty", kernels.F16, []int{0, 4}, nil), kernels.F16, []float32{}},
		{WriteTensor{Name: "h.f64", Dtype: "F64", Shape: []int{3}, Data: f64}, OtherDType, []float32{1.5, -2.25, 1e-3}},
		{WriteTensor{Name: "i.e5m2", Dtype: "F8_E5M2", Shape: []int{3}, Data: []byte{0x3c, 0xc0, 0x00}}, OtherDType, []float32{1, -2, 0}},
		{WriteTensor{Name: "j.e8m0", Dtype: "F8_E8M0", Shape: []int{3}, Data: []byte{127, 130, 120}}, OtherDType, []float32{1, 8, 1.0 / 128}},
		{WriteTensor{Name: "k.i64", Dtype: "I64", Shape: []int{2, 2}, Data: rawBytes(32, 6)}, OtherDType, nil},
		{WriteTensor{Name: "l.i32", Dtype: "I32", Shape: []int{3}, Data: rawBytes(12, 7)}, OtherDType, nil},
		{WriteTensor{Name: "m.u8", Dtype: "U8", Shape: []int{5}, Data: rawBytes(5, 8)}, OtherDType, nil},
		{WriteTensor{Name: "n.bool", Dtype: "BOOL", Shape: []int{2}, Data: []byte{0, 1}}, OtherDType, nil},
		{WriteTensor{Name: "o.f4", Dtype: "F4", Shape: []int{4}, Data: rawBytes(2, 9)}, OtherDType, nil},
	}
	var ws []WriteTensor
	for _, c := range cases {
		ws = append(ws, c.w)
	}
	dir := t.TempDir()
	meta := map[string]string{"format": "pt"}
	mustWrite(t, filepath.Join(dir, "model.safetensors"), ws, meta)

	mem, err := FromMemory(ws)
	if err != nil {
		t.Fatal(err)
	}
	memMap := map[string]*Tensor{}
	for _, w := range ws {
		memMap[w.Name] = &Tensor{DType: w.DType, Dtype: w.Dtype, Shape: w.Shape, Data: w.Data}
	}
	for _, set := range []struct {
		name string
		s    *Set
	}{{"file", mustOpen(t, dir)}, {"FromMemory", mem}, {"NewMem", NewMem(memMap)}} {
		t.Run(set.name, func(t *testing.T) {
			s := set.s
			var want []string
			for _, c := range cases {
				want = append(want, c.w.Name)
			}
			slices.Sort(want)
			if got := s.Names(); !slices.Equal(got, want) {
				t.Fatalf("Names = %v, want %v", got, want)
			}
			if set.name == "file" {
				if s.Dir() != dir || s.Metadata()["format"] != "pt" {
					t.Errorf("Dir = %q, Metadata = %v", s.Dir(), s.Metadata())
				}
			}
			for _, c := range cases {
				tn, err := s.Tensor(c.w.Name)
				if err != nil {
					t.Fatal(err)
				}
				wantShape := c.w.Shape
				if wantShape == nil {
					wantShape = []int{}
				}
				if tn.Name != c.w.Name || tn.DType != c.kd || tn.Dtype != c.w.dtype() || !slices.Equal(tn.Shape, wantShape) || string(tn.Data) != string(c.w.Data) {
					t.Errorf("%s: got %s %v %v %v (%d bytes)", c.w.Name, tn.Name, tn.DType, tn.Dtype, tn.Shape, len(tn.Data))
				}
				if set.name == "file" && tn.File != filepath.Join(dir, "model.safetensors") {
					t.Errorf("%s: File = %q", c.w.Name, tn.File)
				}
				numel := 1
				for _, d := range wantShape {
					numel *= d
				}
				if tn.Numel() != numel {
					t.Errorf("%s: Numel = %d, want %d", c.w.Name, tn.Numel(), numel)
				}
				f, err := s.Float32(c.w.Name, wantShape...)
				if c.floats == nil {
					if err == nil || !strings.Contains(err.Error(), c.w.Dtype) || !strings.Contains(err.Error(), "want a float dtype") {
						t.Errorf("%s: Float32 error = %v", c.w.Name, err)
					}
					if _, err := s.Mat(c.w.Name, 2, 2); err == nil {
						t.Errorf("%s: Mat of a non-float dtype succeeded", c.w.Name)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(f, c.floats) && !(len(f) == 3 && float32(1e-3) == c.floats[2] && f[2] == float32(1e-3)) {
					t.Errorf("%s: Float32 = %v, want %v", c.w.Name, f, c.floats)
				}
				if len(wantShape) == 2 && c.kd != kernels.F8E4M3 && wantShape[0] > 0 {
					m, err := s.Mat(c.w.Name, wantShape[0], wantShape[1])
					if err != nil {
						t.Fatal(err)
					}
					row := make([]float32, m.Cols)
					for r := range m.Rows {
						m.RowF32(row, r)
						if !slices.Equal(row, c.floats[r*m.Cols:(r+1)*m.Cols]) {
							t.Errorf("%s row %d: %v", c.w.Name, r, row)
						}
					}
				}
			}
		})
	}
}

func TestOpenLayouts(t *testing.T) {
	a := Encode("model.a.weight", kernels.BF16, []int{2, 3}, vals(6, 1))
	b := Encode("model.b.weight", kernels.F32, []int{4}, vals(4, 2))
	c := Encode("model.c.weight", kernels.F16, []int{3, 3}, vals(9, 3))

	t.Run("sharded", func(t *testing.T) {
		dir := t.TempDir()
		mustWrite(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), []WriteTensor{a, b}, nil)
		mustWrite(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), []WriteTensor{c}, nil)
		// A stray file the index does not name is ignored.
		mustWrite(t, filepath.Join(dir, "stray.safetensors"), []WriteTensor{a}, nil)
		index := `{"metadata": {"total_size": 70}, "weight_map": {
  "model.a.weight": "model-00001-of-00002.safetensors",
  "model.b.weight": "model-00001-of-00002.safetensors",
  "model.c.weight": "model-00002-of-00002.safetensors"}}`
		os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(index), 0o644)
		s := mustOpen(t, dir)
		if got := s.Names(); !slices.Equal(got, []string{"model.a.weight", "model.b.weight", "model.c.weight"}) {
			t.Fatalf("Names = %v", got)
		}
		tc, _ := s.Tensor("model.c.weight")
		if tc.File != filepath.Join(dir, "model-00002-of-00002.safetensors") {
			t.Errorf("File = %q", tc.File)
		}
		f, err := s.Float32("model.c.weight", 3, 3)
		if err != nil || !slices.Equal(f, vals(9, 3)) {
			t.Errorf("Float32 = %v, %v", f, err)
		}
	})
	t.Run("glob", func(t *testing.T) {
		dir := t.TempDir()
		mustWrite(t, filepath.Join(dir, "consolidated.safetensors"), []WriteTensor{a}, nil)
		mustWrite(t, filepath.Join(dir, "extra.safetensors"), []WriteTensor{b, c}, nil)
		os.WriteFile(filepath.Join(dir, "._consolidated.safetensors"), []byte("junk"), 0o644)
		s := mustOpen(t, dir)
		if len(s.Names()) != 3 || !s.Has("model.b.weight") || s.Has("nope") {
			t.Fatalf("Names = %v", s.Names())
		}
	})
	t.Run("single file path", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "x.safetensors")
		mustWrite(t, p, []WriteTensor{a}, nil)
		s := mustOpen(t, p)
		if s.Dir() != dir || !s.Has("model.a.weight") {
			t.Fatalf("Dir = %q, Names = %v", s.Dir(), s.Names())
		}
	})
	t.Run("model.safetensors wins", func(t *testing.T) {
		dir := t.TempDir()
		mustWrite(t, filepath.Join(dir, "model.safetensors"), []WriteTensor{a}, nil)
		mustWrite(t, filepath.Join(dir, "other.safetensors"), []WriteTensor{a}, nil)
		if s := mustOpen(t, dir); len(s.Names()) != 1 {
			t.Fatalf("Names = %v", s.Names())
		}
	})
}

// header renders one header entry.
func entry(name, dtype string, shape []int, begin, end int) string {
	var dims []string
	for _, d := range shape {
		dims = append(dims, fmt.Sprint(d))
	}
	return fmt.Sprintf(`%q:{"dtype":%q,"shape":[%s],"data_offsets":[%d,%d]}`, name, dtype, strings.Join(dims, ","), begin, end)
}

func TestOpenErrors(t *testing.T) {
	const file = "model.safetensors"
	good := entry("w", "F32", []int{2, 2}, 0, 16)
	a := Encode("a", kernels.F32, []int{2}, []float32{1, 2})
	b := Encode("b", kernels.F32, []int{2}, []float32{3, 4})
	index := func(dir, text string) {
		os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(text), 0o644)
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  []string // substrings of the error
	}{
		{"empty dir", func(t *testing.T, dir string) {}, []string{"no model.safetensors"}},
		{"too short", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, file), []byte{1, 2, 3}, 0o644)
		}, []string{file, "3 bytes", "too short"}},
		{"header past end", func(t *testing.T, dir string) {
			var n [8]byte
			binary.LittleEndian.PutUint64(n[:], 1000)
			os.WriteFile(filepath.Join(dir, file), append(n[:], `{"w":`...), 0o644)
		}, []string{file, "header length 1000", "past the end", "5 bytes"}},
		{"absurd header", func(t *testing.T, dir string) {
			var n [8]byte
			binary.LittleEndian.PutUint64(n[:], 1<<62)
			os.WriteFile(filepath.Join(dir, file), append(n[:], `{}`...), 0o644)
		}, []string{file, "header length 4611686018427387904", "limit"}},
		{"not JSON", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w": {"dtype": F32}}`, nil)
		}, []string{file, "not valid JSON", "byte"}},
		{"truncated JSON", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w": {"dtype": "F32"`, nil)
		}, []string{file, "not valid JSON"}},
		{"not an object", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `[1, 2]`, nil)
		}, []string{file, "not a JSON object"}},
		{"trailing data", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+good+`} {}`, make([]byte, 16))
		}, []string{file, "after its JSON object"}},
		{"duplicate name", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+good+`,`+good+`}`, make([]byte, 16))
		}, []string{file, `"w" twice`}},
		{"unknown dtype", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+entry("w", "Q4_K", []int{2}, 0, 2)+`}`, make([]byte, 2))
		}, []string{file, `tensor "w"`, `unknown dtype "Q4_K"`}},
		{"missing dtype", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4))
		}, []string{file, `tensor "w"`, "no dtype"}},
		{"missing offsets", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"dtype":"F32","shape":[1]}}`, make([]byte, 4))
		}, []string{file, `tensor "w"`, "no data_offsets"}},
		{"entry not an object", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":7}`, nil)
		}, []string{file, `tensor "w"`, "header entry is a JSON number, want an object"}},
		{"shape not an array", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"dtype":"F32","shape":"2x2","data_offsets":[0,16]}}`, make([]byte, 16))
		}, []string{file, `tensor "w"`, "shape is a JSON string, want an array of integers"}},
		{"dtype not a string", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4))
		}, []string{file, `tensor "w"`, "dtype is a JSON number, want a string"}},
		{"negative dim", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+entry("w", "F32", []int{-2, 2}, 0, 16)+`}`, make([]byte, 16))
		}, []string{file, `tensor "w"`, "negative dimension", "[-2 2]"}},
		{"fractional dim", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, make([]byte, 4))
		}, []string{file, `tensor "w"`, "not an integer"}},
		{"size mismatch", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+entry("w", "BF16", []int{2, 3}, 0, 16)+`}`, make([]byte, 16))
		}, []string{file, `tensor "w"`, "span 16 bytes, want 12", "[2 3]", "BF16"}},
		{"offsets reversed", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+entry("w", "F32", []int{0}, 8, 4)+`}`, make([]byte, 16))
		}, []string{file, `tensor "w"`, "[8 4]", "end before"}},
		{"negative offset", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, make([]byte, 4))
		}, []string{file, `tensor "w"`, "non-negative"}},
		{"truncated data", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+good+`}`, make([]byte, 10))
		}, []string{file, `tensor "w"`, "[0 16]", "past the end of the data (10 bytes"}},
		{"truncated WriteFile output", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file)
			mustWrite(t, p, []WriteTensor{a, b}, nil)
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()-3)
		}, []string{file, `tensor "b"`, "past the end of the data"}},
		{"overlap", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{`+entry("x", "F32", []int{2}, 0, 8)+`,`+entry("y", "F32", []int{2}, 4, 12)+`}`, make([]byte, 12))
		}, []string{file, `"x"`, `"y"`, "overlap"}},
		{"bad metadata", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, file), `{"__metadata__":{"n":1},`+good+`}`, make([]byte, 16))
		}, []string{file, "__metadata__"}},
		{"index not JSON", func(t *testing.T, dir string) {
			index(dir, "{\n  \"weight_map\": {\n    \"a\": \"s1.safetensors\",,\n  }\n}")
		}, []string{"model.safetensors.index.json:3:", "not valid JSON"}},
		{"index without weight_map", func(t *testing.T, dir string) {
			index(dir, `{"metadata":{}}`)
		}, []string{"model.safetensors.index.json", "weight_map"}},
		{"index names a missing shard", func(t *testing.T, dir string) {
			mustWrite(t, filepath.Join(dir, "s1.safetensors"), []WriteTensor{a}, nil)
			index(dir, `{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}`)
		}, []string{"model.safetensors.index.json", `"s2.safetensors"`, `"b"`}},
		{"index tensor absent from its shard", func(t *testing.T, dir string) {
			mustWrite(t, filepath.Join(dir, "s1.safetensors"), []WriteTensor{a}, nil)
			mustWrite(t, filepath.Join(dir, "s2.safetensors"), []WriteTensor{b}, nil)
			index(dir, `{"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}}`)
		}, []string{"model.safetensors.index.json", `tensor "b"`, "s1.safetensors"}},
		{"index shard escapes dir", func(t *testing.T, dir string) {
			index(dir, `{"weight_map":{"a":"../s1.safetensors"}}`)
		}, []string{"model.safetensors.index.json", `"../s1.safetensors"`}},
		{"duplicate across shards", func(t *testing.T, dir string) {
			mustWrite(t, filepath.Join(dir, "s1.safetensors"), []WriteTensor{a}, nil)
			mustWrite(t, filepath.Join(dir, "s2.safetensors"), []WriteTensor{a, b}, nil)
			index(dir, `{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}`)
		}, []string{"s2.safetensors", `duplicate tensor "a"`, "s1.safetensors"}},
		{"duplicate across files", func(t *testing.T, dir string) {
			mustWrite(t, filepath.Join(dir, "s1.safetensors"), []WriteTensor{a, b}, nil)
			mustWrite(t, filepath.Join(dir, "s2.safetensors"), []WriteTensor{b}, nil)
		}, []string{"s2.safetensors", `duplicate tensor "b"`, "s1.safetensors"}},
		{"corrupt shard", func(t *testing.T, dir string) {
			mustWrite(t, filepath.Join(dir, "s1.safetensors"), []WriteTensor{a}, nil)
			writeRaw(t, filepath.Join(dir, "s2.safetensors"), `{`+entry("b", "F32", []int{2}, 0, 8)+`}`, make([]byte, 4))
			index(dir, `{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}`)
		}, []string{"s2.safetensors", `tensor "b"`, "past the end"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(t, dir)
			s, err := Open(dir)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestAccessErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "model.safetensors")
	w, _ := QuantizeF8("f8.weight", 4, 4, 2, 2, vals(16, 1))
	mustWrite(t, p, []WriteTensor{
		Encode("m.weight", kernels.BF16, []int{2, 3}, vals(6, 1)),
		Encode("x.experts", kernels.F16, []int{4, 2, 3}, vals(24, 2)),
		{Name: "ids", Dtype: "I64", Shape: []int{2}, Data: make([]byte, 16)},
		w, // no scales
	}, nil)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	check := func(err error, want string) {
		t.Helper()
		if err == nil || err.Error() != want {
			t.Errorf("error = %v\nwant    %s", err, want)
		}
	}
	_, err = s.Mat("m.weight", 3, 2)
	check(err, p+`: tensor "m.weight" has shape [2 3], want [3 2]`)
	_, err = s.Mat("x.experts", 2, 3)
	check(err, p+`: tensor "x.experts" has shape [4 2 3], want [2 3]`)
	_, err = s.Float32("m.weight", 6)
	check(err, p+`: tensor "m.weight" has shape [2 3], want [6]`)
	_, err = s.Float32("m.weight")
	check(err, p+`: tensor "m.weight" has shape [2 3], want []`)
	_, err = s.Expert("x.experts", 0, 3, 2)
	check(err, p+`: tensor "x.experts" has shape [4 2 3], want [4 3 2]`)
	_, err = s.Expert("m.weight", 0, 2, 3)
	check(err, p+`: tensor "m.weight" has shape [2 3], want [E 2 3]`)
	_, err = s.Expert("x.experts", 4, 2, 3)
	check(err, p+`: tensor "x.experts" has 4 experts, want expert 4`)
	_, err = s.Mat("ids", 1, 2)
	check(err, p+`: tensor "ids" has shape [2], want [1 2]`)
	_, err = s.Float32("ids", 2)
	check(err, p+`: tensor "ids" has dtype I64, want a float dtype (F32, BF16, F16 or F8_E4M3, F8_E5M2, F8_E8M0 or F64)`)
	_, err = s.Tensor("nope")
	check(err, dir+`: missing tensor "nope"`)
	_, err = s.Mat("nope", 1, 1)
	check(err, dir+`: missing tensor "nope"`)
	_, err = s.Mat("f8.weight", 4, 4)
	check(err, dir+`: missing tensor "f8.weight_scale_inv" (the block scales of F8_E4M3 tensor "f8.weight")`)
	if tn, _ := s.Tensor("ids"); tn.DType != OtherDType || tn.DType.Size() != 0 {
		t.Errorf("ids DType = %v", tn.DType)
	}

	// Tensor returns a copy: changing it does not change the Set.
	tn, _ := s.Tensor("m.weight")
	tn.Shape[0] = 99
	if _, err := s.Mat("m.weight", 2, 3); err != nil {
		t.Error(err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Mat("m.weight", 2, 3)
	if err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("after Close: %v", err)
	}

	mem := NewMem(map[string]*Tensor{"v": NewTensor(kernels.F32, []int{2}, []float32{1, 2})})
	_, err = mem.Float32("v", 3)
	check(err, `in-memory weights: tensor "v" has shape [2], want [3]`)
	_, err = FromMemory([]WriteTensor{{Name: "v", DType: kernels.F32, Shape: []int{3}, Data: make([]byte, 8)}})
	check(err, `in-memory weights: tensor "v": 8 bytes of data, want 12 (shape [3] of F32)`)
	err = WriteFile(filepath.Join(dir, "bad.safetensors"), []WriteTensor{{Name: "v", Dtype: "Q8", Data: []byte{1}}}, nil)
	if err == nil || !strings.Contains(err.Error(), `unknown dtype "Q8"`) {
		t.Errorf("WriteFile error = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.safetensors")); err == nil {
		t.Error("WriteFile left a file behind after an error")
	}
}

// refDequant is the reference block dequantisation: element (r, c) is
// fp8(q[r, c]) × scale[r/br, c/bc], computed independently of kernels.Mat.
func refDequant(q []byte, scale []float32, rows, cols, br, bc int) []float32 {
	sc := (cols + bc - 1) / bc
	out := make([]float32, rows*cols)
	for r := range rows {
		for c := range cols {
			out[r*cols+c] = kernels.F8E4M3ToF32(q[r*cols+c]) * scale[(r/br)*sc+c/bc]
		}
	}
	return out
}

func randn(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64()) * 0.02
	}
	return v
}

func TestF8BlockScales(t *testing.T) {
	cases := []struct {
		rows, cols, br, bc int
		hint               [2]int // SetBlockSize, if any
	}{
		{300, 200, 128, 128, [2]int{}}, // ragged edges, 128 preferred
		{256, 256, 64, 64, [2]int{}},   // non-default block inferred
		{96, 40, 128, 128, [2]int{}},   // one block
		{300, 200, 100, 50, [2]int{100, 50}},
		{7, 5, 2, 3, [2]int{2, 3}}, // 3 and 4 both give 2 column blocks: needs the hint
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%d/%dx%d", c.rows, c.cols, c.br, c.bc), func(t *testing.T) {
			orig := randn(c.rows*c.cols, uint64(c.rows))
			w, sc := QuantizeF8("layer.weight", c.rows, c.cols, c.br, c.bc, orig)
			dir := t.TempDir()
			mustWrite(t, filepath.Join(dir, "model.safetensors"), []WriteTensor{w, sc}, nil)
			s := mustOpen(t, dir)
			if c.hint[0] > 0 {
				s.SetBlockSize(c.hint[0], c.hint[1])
			}
			m, err := s.Mat("layer.weight", c.rows, c.cols)
			if err != nil {
				t.Fatal(err)
			}
			if m.DType != kernels.F8E4M3 || m.BlockRows != c.br && c.br < c.rows || m.BlockCols != c.bc && c.bc < c.cols {
				t.Fatalf("Mat = %v blocks %dx%d", m.DType, m.BlockRows, m.BlockCols)
			}
			scales, err := s.Float32("layer.weight_scale_inv", (c.rows+c.br-1)/c.br, (c.cols+c.bc-1)/c.bc)
			if err != nil {
				t.Fatal(err)
			}
			want := refDequant(w.Data, scales, c.rows, c.cols, c.br, c.bc)
			got := ref.MatF32(m)
			if !slices.Equal(got, want) {
				t.Fatal("Mat.RowF32 differs from the reference dequantisation")
			}
			f, err := s.Float32("layer.weight", c.rows, c.cols)
			if err != nil || !slices.Equal(f, want) {
				t.Fatalf("Float32 of the fp8 weight differs from the reference (%v)", err)
			}
			for i, v := range got { // fp8 keeps about 3 significant bits
				if d := math.Abs(float64(v - orig[i])); d > 0.07*math.Abs(float64(orig[i]))+1e-6 {
					t.Fatalf("element %d: %g, from %g", i, v, orig[i])
				}
			}
		})
	}
	t.Run("per-tensor scale", func(t *testing.T) {
		q := Encode("w", kernels.F8E4M3, []int{3, 4}, vals(12, 1))
		s := NewMem(map[string]*Tensor{
			"w":           {DType: kernels.F8E4M3, Shape: q.Shape, Data: q.Data},
			"w_scale_inv": NewTensor(kernels.F32, nil, []float32{0.5}),
		})
		m, err := s.Mat("w", 3, 4)
		if err != nil {
			t.Fatal(err)
		}
		want := vals(12, 1)
		for i := range want {
			want[i] *= 0.5
		}
		if got := ref.MatF32(m); !slices.Equal(got, want) {
			t.Fatalf("got %v want %v", got, want)
		}
	})
	t.Run("bad scale shape", func(t *testing.T) {
		w, _ := QuantizeF8("w.weight", 300, 200, 128, 128, randn(300*200, 1))
		s, _ := FromMemory([]WriteTensor{w, Encode("w.weight_scale_inv", kernels.F32, []int{400, 2}, make([]float32, 800))})
		_, err := s.Mat("w.weight", 300, 200)
		if err == nil || !strings.Contains(err.Error(), `tensor "w.weight_scale_inv" has shape [400 2], want [ceil(rows/block) ceil(cols/block)]`) {
			t.Fatalf("error = %v", err)
		}
		s, _ = FromMemory([]WriteTensor{w, Encode("w.weight_scale_inv", kernels.F32, []int{2, 2, 2}, make([]float32, 8))})
		_, err = s.Mat("w.weight", 300, 200)
		if err == nil || !strings.Contains(err.Error(), `tensor "w.weight_scale_inv" has shape [2 2 2], want [rowBlocks colBlocks]`) {
			t.Fatalf("error = %v", err)
		}
		s, _ = FromMemory([]WriteTensor{w, Encode("w.weight_scale_inv", kernels.F32, []int{3, 2}, make([]float32, 6))})
		s.SetBlockSize(64, 64)
		_, err = s.Mat("w.weight", 300, 200)
		if err == nil || !strings.Contains(err.Error(), "want [5 4]") {
			t.Fatalf("error = %v", err)
		}
	})
}

func TestExpert(t *testing.T) {
	const E, R, C = 5, 6, 4
	v := vals(E*R*C, 9)
	s := NewMem(map[string]*Tensor{"mlp.experts.down_proj": NewTensor(kernels.BF16, []int{E, R, C}, v)})
	full, _ := s.Tensor("mlp.experts.down_proj")
	for e := range E {
		m, err := s.Expert("mlp.experts.down_proj", e, R, C)
		if err != nil {
			t.Fatal(err)
		}
		if m.Rows != R || m.Cols != C || m.DType != kernels.BF16 {
			t.Fatalf("expert %d: %dx%d %v", e, m.Rows, m.Cols, m.DType)
		}
		if &m.Data[0] != &full.Data[e*R*C*2] || len(m.Data) != R*C*2 {
			t.Fatalf("expert %d: Data is not a view of the fused tensor", e)
		}
		if got := ref.MatF32(m); !slices.Equal(got, v[e*R*C:(e+1)*R*C]) {
			t.Fatalf("expert %d: %v", e, got)
		}
	}

	// F8 experts with [E, rowBlocks, colBlocks] scales.
	const FR, FC, B = 40, 24, 16
	var ws []WriteTensor
	var q []byte
	var sc []float32
	for e := range 3 {
		w, s := QuantizeF8("x", FR, FC, B, B, randn(FR*FC, uint64(e)))
		q = append(q, w.Data...)
		for i := range len(s.Data) / 4 {
			sc = append(sc, math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:])))
		}
	}
	ws = append(ws, WriteTensor{Name: "experts.gate_up_proj", DType: kernels.F8E4M3, Shape: []int{3, FR, FC}, Data: q})
	ws = append(ws, Encode("experts.gate_up_proj_scale_inv", kernels.F32, []int{3, 3, 2}, sc))
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "model.safetensors"), ws, nil)
	fs := mustOpen(t, dir)
	for e := range 3 {
		m, err := fs.Expert("experts.gate_up_proj", e, FR, FC)
		if err != nil {
			t.Fatal(err)
		}
		if m.BlockRows != B || m.BlockCols != B {
			t.Fatalf("blocks %dx%d", m.BlockRows, m.BlockCols)
		}
		want := refDequant(q[e*FR*FC:(e+1)*FR*FC], sc[e*6:(e+1)*6], FR, FC, B, B)
		if !slices.Equal(ref.MatF32(m), want) {
			t.Fatalf("expert %d differs from the reference dequantisation", e)
		}
	}
}

func TestF32ToF16(t *testing.T) {
	// Every half value round-trips.
	for h := range 1 << 16 {
		f := kernels.F16ToF32(uint16(h))
		if f != f {
			if g := F32ToF16(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("NaN %#04x -> %#04x", h, g)
			}
			continue
		}
		if g := F32ToF16(f); g != uint16(h) {
			t.Fatalf("%#04x (%g) -> %#04x", h, f, g)
		}
	}
	// Midpoints round to even; just above/below round to nearest.
	for h := range uint16(0x7bff) {
		lo, hi := float64(kernels.F16ToF32(h)), float64(kernels.F16ToF32(h+1))
		mid := float32((lo + hi) / 2)
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		if g := F32ToF16(mid); g != even {
			t.Fatalf("midpoint of %#04x/%#04x -> %#04x", h, h+1, g)
		}
		if g := F32ToF16(math.Nextafter32(mid, 0)); g != h {
			t.Fatalf("below midpoint of %#04x -> %#04x", h, g)
		}
		if g := F32ToF16(math.Nextafter32(mid, 1e9)); g != h+1 {
			t.Fatalf("above midpoint of %#04x -> %#04x", h, g)
		}
		if g := F32ToF16(-mid); g != even|0x8000 {
			t.Fatalf("negative midpoint of %#04x -> %#04x", h, g)
		}
	}
	for _, c := range []struct {
		f float32
		h uint16
	}{{65520, 0x7c00}, {65519, 0x7bff}, {1e10, 0x7c00}, {float32(math.Inf(-1)), 0xfc00}, {1e-10, 0}, {-1e-10, 0x8000}, {0x1p-25, 0}, {0x1.000002p-25, 1}} {
		if g := F32ToF16(c.f); g != c.h {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.f, g, c.h)
		}
	}
}

func TestF32ToF8E4M3(t *testing.T) {
	for b := range 256 {
		f := kernels.F8E4M3ToF32(uint8(b))
		g := F32ToF8E4M3(f)
		if f != f {
			if g&0x7f != 0x7f {
				t.Fatalf("NaN -> %#02x", g)
			}
			continue
		}
		if g != uint8(b) {
			t.Fatalf("%#02x (%g) -> %#02x", b, f, g)
		}
	}
	for b := range uint8(0x7d) {
		lo, hi := kernels.F8E4M3ToF32(b), kernels.F8E4M3ToF32(b+1)
		mid := (lo + hi) / 2
		even := b
		if b&1 == 1 {
			even = b + 1
		}
		if g := F32ToF8E4M3(mid); g != even {
			t.Fatalf("midpoint of %#02x/%#02x -> %#02x", b, b+1, g)
		}
		if g := F32ToF8E4M3(math.Nextafter32(mid, 0)); g != b {
			t.Fatalf("below midpoint of %#02x -> %#02x", b, g)
		}
		if g := F32ToF8E4M3(-math.Nextafter32(mid, 1e9)); g != (b+1)|0x80 {
			t.Fatalf("above negative midpoint of %#02x -> %#02x", b, g)
		}
	}
	if g := F32ToF8E4M3(1e6); g != 0x7e {
		t.Errorf("saturation: %#02x", g)
	}
	if g := F32ToF8E4M3(-1e6); g != 0xfe {
		t.Errorf("saturation: %#02x", g)
	}
}

func TestBlockSize(t *testing.T) {
	cases := []struct{ n, blocks, hint, want int }{
		{300, 3, 0, 128}, {256, 4, 0, 64}, {300, 1, 0, 512}, {100, 1, 0, 128},
		{300, 5, 0, 64}, {7, 3, 0, 3}, {10, 10, 0, 1}, {300, 3, 100, 100},
	}
	for _, c := range cases {
		got, ok := blockSize(c.n, c.blocks, c.hint)
		if !ok || got != c.want || ceilDiv(c.n, got) != c.blocks {
			t.Errorf("blockSize(%d, %d, %d) = %d, %v; want %d", c.n, c.blocks, c.hint, got, ok, c.want)
		}
	}
	for _, c := range [][3]int{{300, 4, 128}, {10, 11, 0}, {10, 0, 0}} {
		if b, ok := blockSize(c[0], c[1], c[2]); ok {
			t.Errorf("blockSize(%v) = %d, ok", c, b)
		}
	}
}

func TestConcurrentAccess(t *testing.T) {
	dir := t.TempDir()
	var ws []WriteTensor
	for i := range 8 {
		w, s := QuantizeF8(fmt.Sprintf("l%d.weight", i), 64, 32, 32, 32, randn(64*32, uint64(i)))
		ws = append(ws, w, s, Encode(fmt.Sprintf("l%d.norm", i), kernels.BF16, []int{32}, vals(32, uint64(i))))
	}
	mustWrite(t, filepath.Join(dir, "model.safetensors"), ws, nil)
	s := mustOpen(t, dir)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 8 {
				m, err := s.Mat(fmt.Sprintf("l%d.weight", (i+g)%8), 64, 32)
				if err != nil {
					t.Error(err)
					return
				}
				ref.MatF32(m)
				if _, err := s.Float32(fmt.Sprintf("l%d.norm", i), 32); err != nil {
					t.Error(err)
				}
				s.Names()
			}
		})
	}
	wg.Wait()
}
