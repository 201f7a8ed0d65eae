package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
)

// sample is a small valid file with metadata of every type and two tensors.
func sample() *ggufwrite.Writer {
	w := &ggufwrite.Writer{}
	w.Add("general.architecture", "llama")
	w.Add("u8", uint8(200))
	w.Add("i8", int8(-5))
	w.Add("u16", uint16(60000))
	w.Add("i16", int16(-300))
	w.Add("u32", uint32(4000000000))
	w.Add("i32", int32(-70000))
	w.Add("f32", float32(1.5))
	w.Add("bool", true)
	w.Add("str", "héllo")
	w.Add("u64", uint64(1)<<63)
	w.Add("i64", int64(-1)<<40)
	w.Add("f64", 2.25)
	w.Add("strs", []string{"a", "", "ccc"})
	w.Add("ints", []int32{1, -2, 3})
	w.Add("floats", []float32{0.5, -1})
	w.Add("bools", []bool{true, false})
	w.Tensors = []ggufwrite.Tensor{
		{Name: "a", Type: ggufwrite.F32, Dims: []uint64{3, 2}, Data: ggufwrite.EncodeF32([]float32{1, 2, 3, 4, 5, 6})},
		{Name: "b", Type: ggufwrite.Q8_0, Dims: []uint64{32}, Data: make([]byte, 34)},
	}
	return w
}

func TestParseValues(t *testing.T) {
	f, err := Parse("sample", sample().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m := f.Meta
	if f.Version != 3 || f.Alignment != 32 || f.DataStart%32 != 0 {
		t.Errorf("version %d alignment %d data start %d", f.Version, f.Alignment, f.DataStart)
	}
	ints := map[string]int64{"u8": 200, "i8": -5, "u16": 60000, "i16": -300, "u32": 4000000000, "i32": -70000, "i64": -1 << 40}
	for k, want := range ints {
		v, _ := m.Get(k)
		if got, ok := v.Int(); !ok || got != want {
			t.Errorf("%s = %d %v, want %d", k, got, ok, want)
		}
	}
	if v, _ := m.Get("u64"); true {
		if u, ok := v.Uint(); !ok || u != 1<<63 {
			t.Errorf("u64 = %d %v", u, ok)
		}
		if _, ok := v.Int(); ok {
			t.Error("u64 above MaxInt64 reads as an int64")
		}
	}
	if v, _ := m.Get("i8"); true {
		if _, ok := v.Uint(); ok {
			t.Error("negative i8 reads as unsigned")
		}
	}
	for k, want := range map[string]float64{"f32": 1.5, "f64": 2.25, "u8": 200} {
		v, _ := m.Get(k)
		if got, ok := v.Float(); !ok || got != want {
			t.Errorf("%s = %g %v, want %g", k, got, ok, want)
		}
	}
	if v, _ := m.Get("bool"); true {
		if b, ok := v.Bool(); !ok || !b {
			t.Errorf("bool = %v %v", b, ok)
		}
	}
	if s := m.String("str"); s != "héllo" {
		t.Errorf("str = %q", s)
	}
	v, _ := m.Get("strs")
	if s, ok := v.Strings(); !ok || !slices.Equal(s, []string{"a", "", "ccc"}) {
		t.Errorf("strs = %q %v", s, ok)
	}
	v, _ = m.Get("ints")
	if s, ok := v.Ints(); !ok || !slices.Equal(s, []int64{1, -2, 3}) {
		t.Errorf("ints = %v %v", s, ok)
	}
	v, _ = m.Get("floats")
	if s, ok := v.Floats(); !ok || !slices.Equal(s, []float64{0.5, -1}) {
		t.Errorf("floats = %v %v", s, ok)
	}
	v, _ = m.Get("bools")
	if _, ok := v.Ints(); ok || v.Len != 2 || v.Elem != TypeBool {
		t.Errorf("bools: %+v", v)
	}
	var zero Value // what a missing key gives
	if _, ok := zero.Uint(); ok {
		t.Error("zero Value reads as an integer")
	}
	if _, ok := zero.Float(); ok {
		t.Error("zero Value reads as a float")
	}
	if m.FileType() != "" {
		t.Errorf("FileType without general.file_type = %q", m.FileType())
	}
	if got := len(m.Keys()); got != 17 {
		t.Errorf("%d keys, want 17", got)
	}
	a := f.Tensors[0]
	if a.Name != "a" || !slices.Equal(a.Shape(), []int{2, 3}) || f32At(a.Data, 5) != 6 {
		t.Errorf("tensor a: %v %v", a.Shape(), a.Data)
	}
	if kd, ok := f.Tensors[1].Type.DType(); !ok || kd != kernels.Q8_0 || len(f.Tensors[1].Data) != 34 {
		t.Errorf("tensor b: %v %v %d bytes", kd, ok, len(f.Tensors[1].Data))
	}
}

// le64 overwrites 8 bytes at off.
func le64(b []byte, off int, v uint64) []byte {
	c := slices.Clone(b)
	binary.LittleEndian.PutUint64(c[off:], v)
	return c
}

// TestParseErrors checks that every kind of broken file is a named error.
func TestParseErrors(t *testing.T) {
	good := sample().Bytes()
	// Offsets into the header: magic 4, version 4, tensor count 8, kv count 8,
	// then the first key (length 8 + "general.architecture").
	const firstKey = 24
	valueLen := firstKey + 8 + len("general.architecture") + 4 // the string value's length
	badAlign := sample()
	badAlign.Add("general.alignment", uint32(48))
	badAlignType := sample()
	badAlignType.Add("general.alignment", uint64(32))
	dup := sample()
	dup.Add("u8", uint8(1))
	dupTensor := sample()
	dupTensor.Tensors = append(dupTensor.Tensors, dupTensor.Tensors[0])
	notBlocks := sample()
	notBlocks.Tensors[1].Dims = []uint64{31}
	badType := sample()
	badType.Tensors[0].Type = 99
	noDims := sample()
	noDims.Tensors[0].Dims = nil
	huge := sample()
	huge.Tensors[0].Dims = []uint64{1 << 40, 1 << 40}
	overlap := sample().Bytes()
	// The second tensor's offset is the last 8 bytes of its descriptor, just
	// before the padding to the data section; find it by its name.
	at := strings.Index(string(overlap), "\x01\x00\x00\x00\x00\x00\x00\x00b") + 9 + 4 + 8 + 4
	overlap = le64(overlap, at, 0)
	misaligned := le64(sample().Bytes(), at, 40)
	past := le64(sample().Bytes(), at, 1<<20)
	wrapped := le64(sample().Bytes(), at, ^uint64(0)-31)
	badKey := sample()
	badKey.KV[1].Key = "\xff\xfe"

	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrNotGGUF},
		{"magic", append([]byte("GGUX"), good[4:]...), ErrNotGGUF},
		{"version 1", append(append([]byte("GGUF"), 1, 0, 0, 0), good[8:]...), ErrVersion},
		{"big-endian", append(append([]byte("GGUF"), 0, 0, 0, 3), good[8:]...), ErrVersion},
		{"header cut", good[:10], ErrTruncated},
		{"cut in metadata", good[:260], ErrTruncated},
		{"cut in tensor data", good[:len(good)-40], ErrOffset},
		{"lying tensor count", le64(good, 8, 1<<40), ErrCount},
		{"lying metadata count", le64(good, 16, 1<<40), ErrCount},
		{"lying key length", le64(good, firstKey, 1<<50), ErrString},
		{"lying string length", le64(good, valueLen, uint64(len(good))), ErrString},
		{"bad alignment", badAlign.Bytes(), ErrAlignment},
		{"alignment not uint32", badAlignType.Bytes(), ErrAlignment},
		{"duplicate key", dup.Bytes(), ErrDuplicate},
		{"duplicate tensor", dupTensor.Bytes(), ErrDuplicate},
		{"partial block", notBlocks.Bytes(), ErrShape},
		{"unknown tensor type", badType.Bytes(), ErrType},
		{"no dims", noDims.Bytes(), ErrShape},
		{"size overflow", huge.Bytes(), ErrOverflow},
		{"overlapping tensors", overlap, ErrOffset},
		{"misaligned offset", misaligned, ErrOffset},
		{"offset past the end", past, ErrOffset},
		{"offset wraps around", wrapped, ErrOffset},
		{"key not UTF-8", badKey.Bytes(), ErrString},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("f.gguf", c.data)
			if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "f.gguf: ") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// TestParseValueTypeErrors covers bad value and array element types.
func TestParseValueTypeErrors(t *testing.T) {
	w := &ggufwrite.Writer{}
	w.Add("k", uint8(1))
	b := w.Bytes()
	// Patch the value type (after the key) to 13, then to an array of arrays of ...
	typeAt := 24 + 8 + 1
	b13 := slices.Clone(b)
	binary.LittleEndian.PutUint32(b13[typeAt:], 13)
	if _, err := Parse("x", b13); !errors.Is(err, ErrType) {
		t.Errorf("value type 13: %v", err)
	}
	w = &ggufwrite.Writer{}
	w.Add("k", []int32{1})
	b = w.Bytes()
	bArr := slices.Clone(b)
	binary.LittleEndian.PutUint32(bArr[typeAt+4:], 13) // element type
	if _, err := Parse("x", bArr); !errors.Is(err, ErrType) {
		t.Errorf("element type 13: %v", err)
	}
	// A string array whose element claims more bytes than are left.
	w = &ggufwrite.Writer{}
	w.Add("k", []string{"abcdefghij", "de"})
	b = w.Bytes()
	if _, err := Parse("x", le64(b, typeAt+4+4+8, 1<<40)); !errors.Is(err, ErrString) || !strings.Contains(err.Error(), "k[0]") {
		t.Errorf("lying array string: %v", err)
	}
	if _, err := Parse("x", b[:typeAt+4+4+8+8+10+4]); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "k[1]") {
		t.Errorf("array cut in a string length: %v", err)
	}
}

// writeSplit writes the sample's tensors as a model split in n parts.
func writeSplit(t *testing.T, dir string, n int, mutate func(i int, w *ggufwrite.Writer)) string {
	t.Helper()
	all := sample()
	for i := range n {
		w := &ggufwrite.Writer{}
		if i == 0 {
			w.KV = all.KV
			w.Add("split.tensors.count", uint16(len(all.Tensors)))
		}
		w.Add("split.no", uint16(i))
		w.Add("split.count", uint16(n))
		for j, x := range all.Tensors {
			if j%n == i {
				w.Tensors = append(w.Tensors, x)
			}
		}
		if mutate != nil {
			mutate(i, w)
		}
		path := filepath.Join(dir, "m-"+pad5(i+1)+"-of-"+pad5(n)+".gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "m-00001-of-"+pad5(n)+".gguf")
}

func pad5(i int) string { return strings.Repeat("0", 5-len(itoa(i))) + itoa(i) }
func itoa(i int) string { return string(rune('0' + i)) } // i < 10 here

func TestOpenSplit(t *testing.T) {
	dir := t.TempDir()
	first := writeSplit(t, dir, 2, nil)
	// Any part opens the whole model.
	for _, p := range []string{first, filepath.Join(dir, "m-00002-of-00002.gguf")} {
		m, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Parts) != 2 || m.Path != first || !slices.Equal(m.TensorNames(), []string{"a", "b"}) || m.Meta.Arch() != "llama" {
			t.Errorf("%s: parts %v, tensors %v, arch %q", p, m.Parts, m.TensorNames(), m.Meta.Arch())
		}
		if a, ok := m.Tensor("a"); !ok || f32At(a.Data, 0) != 1 {
			t.Error("tensor a not readable")
		}
		m.Close()
		m.Close() // idempotent
	}
	if got := ModelFiles(dir); !slices.Equal(got, []string{first}) {
		t.Errorf("ModelFiles = %v, want the first part only", got)
	}

	for name, mutate := range map[string]func(int, *ggufwrite.Writer){
		"wrong split.no": func(i int, w *ggufwrite.Writer) { w.Set("split.no", uint16(0)) },
		"wrong count":    func(i int, w *ggufwrite.Writer) { w.Set("split.count", uint16(3)) },
		"lying tensors":  func(i int, w *ggufwrite.Writer) { w.Set("split.tensors.count", uint16(5)) },
		"duplicate":      func(i int, w *ggufwrite.Writer) { w.Tensors = sample().Tensors[:1] },
		"split.no absent": func(i int, w *ggufwrite.Writer) {
			w.KV = slices.DeleteFunc(w.KV, func(kv ggufwrite.KV) bool { return kv.Key == "split.no" })
		},
	} {
		d := t.TempDir()
		if _, err := Open(writeSplit(t, d, 2, mutate)); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	d := t.TempDir()
	first = writeSplit(t, d, 2, nil)
	os.Remove(filepath.Join(d, "m-00002-of-00002.gguf"))
	if _, err := Open(first); err == nil || !strings.Contains(err.Error(), "m-00002-of-00002.gguf") {
		t.Errorf("missing part: %v", err)
	}
	// A part renamed as a whole file.
	single := filepath.Join(d, "single.gguf")
	os.Rename(first, single)
	if _, err := Open(single); err == nil || !strings.Contains(err.Error(), "split.count") {
		t.Errorf("part without its split name: %v", err)
	}
}

// FuzzParse feeds mutated files to Parse: it must return a File or an
// error, never panic, and every tensor it returns must lie inside the data.
// A file that parses then goes through the config, tokenizer and weight
// mappings, which must fail with errors, not panics, on whatever metadata
// and tensors it holds.
func FuzzParse(f *testing.F) {
	f.Add(sample().Bytes())
	w := sample()
	w.Add("general.alignment", uint32(64))
	f.Add(w.Bytes())
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	for _, fx := range []string{"qwen3", "glm4_moe_lite", "qwen3_next"} {
		w, err := ggufwrite.Convert(fixtures.Dir(fx), ggufwrite.F32)
		if err != nil {
			f.Fatal(err)
		}
		ggufwrite.AddByteTokenizer(w, 300)
		f.Add(w.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz", data)
		if err != nil {
			return
		}
		for _, k := range file.Meta.Keys() {
			v, _ := file.Meta.Get(k)
			_ = v.String()
			v.Strings()
			v.Ints()
			v.Floats()
		}
		m := &Model{Path: "fuzz", Parts: []string{"fuzz"}, Meta: file.Meta, tensors: map[string]*TensorInfo{}}
		for _, x := range file.Tensors {
			size, err := x.byteSize()
			if err != nil || uint64(len(x.Data)) != size {
				t.Fatalf("tensor %q: %d bytes, size %d (%v)", x.Name, len(x.Data), size, err)
			}
			m.tensors[x.Name] = x
			m.names = append(m.names, x.Name)
		}
		exerciseModel(m)
	})
}

// exerciseModel runs every mapping of m, ignoring errors.
func exerciseModel(m *Model) {
	m.Quantization()
	m.Problem()
	m.Config()
	m.Tokenizer()
	w, err := m.Weights()
	if err != nil {
		return
	}
	for _, name := range []string{"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_b_proj.weight",
		"model.layers.0.linear_attn.in_proj_qkvz.weight", "model.layers.0.mlp.experts.1.gate_proj.weight", "model.layers.0.input_layernorm.weight",
		"model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.conv1d.weight", "mtp.fc.weight", "model.layers.0.self_attn.q_proj.bias",
		"model.layers.0.mlp.experts.gate_up_proj"} {
		if !w.Has(name) {
			continue
		}
		for _, e := range []int{-1, 0, 1 << 30} {
			w.Expert(name, e, 64, 64)
		}
		for _, shape := range [][2]int{{1, 1}, {2, 32}, {64, 64}, {128, 64}, {192, 64}, {128, 32}} {
			w.Mat(name, shape[0], shape[1])
		}
		for _, shape := range [][]int{{64}, {4}, {128, 1, 4}, {2, 3}} {
			w.Float32(name, shape...)
		}
	}
}

// TestFromBytes parses a file held in memory: tensors view the bytes in
// place, CheckpointWeights serves them under their stored names, and a part
// of a split model or a truncated file is refused.
func TestFromBytes(t *testing.T) {
	w := sample()
	w.Add(TensorNamesKey, TensorNamesCheckpoint)
	data := w.Bytes()
	m, err := FromBytes("mem.gguf", data)
	if err != nil {
		t.Fatal(err)
	}
	if !m.KeepsCheckpointNames() || m.Size() != int64(len(data)) || len(m.Parts) != 0 {
		t.Errorf("checkpoint names %v, size %d, parts %v", m.KeepsCheckpointNames(), m.Size(), m.Parts)
	}
	cw := m.CheckpointWeights()
	a, err := cw.Mat("a", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(data, a.Data); i < 0 || &data[i] != &a.Data[0] {
		t.Error("tensor a is not a view of the bytes")
	}
	if v, err := cw.Float32("a", 2, 3); err != nil || v[5] != 6 {
		t.Errorf("Float32(a) = %v, %v", v, err)
	}
	if cw.Has("blk.0.attn_q.weight") || !cw.Has("b") {
		t.Error("CheckpointWeights maps names")
	}
	if _, err := cw.Expert("a", 0, 2, 3); err == nil {
		t.Error("Expert of a 2-D tensor")
	}
	w.Set("split.count", uint16(2))
	if _, err := FromBytes("part.gguf", w.Bytes()); err == nil {
		t.Error("a split part is accepted")
	}
	if _, err := FromBytes("short.gguf", data[:len(data)-40]); err == nil { // into tensor b
		t.Errorf("truncated: %v", err)
	}
}
