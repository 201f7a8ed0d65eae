package ggufwrite_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
)

// TestWriterRoundTrip writes every value type and tensors of several sizes
// and reads them back with engine/gguf's reader: values, shapes, types and
// data, each tensor at an aligned offset.
func TestWriterRoundTrip(t *testing.T) {
	for _, align := range []int{0, 64} {
		w := &ggufwrite.Writer{Alignment: align}
		if align != 0 {
			w.Add("general.alignment", uint32(align))
		}
		w.Add("u8", uint8(7))
		w.Add("i8", int8(-7))
		w.Add("u16", uint16(700))
		w.Add("i16", int16(-700))
		w.Add("u32", uint32(70000))
		w.Add("i32", int32(-70000))
		w.Add("f32", float32(1.5))
		w.Add("bool", true)
		w.Add("str", "ferrite")
		w.Add("u64", uint64(1)<<40)
		w.Add("i64", int64(-1)<<40)
		w.Add("f64", 2.25)
		w.Add("strs", []string{"a", "bc"})
		w.Add("i32s", []int32{1, -2})
		w.Add("f32s", []float32{0.5, -1})
		w.Set("u8", uint8(9)) // replaces
		odd := bytes.Repeat([]byte{0xab}, 34)
		w.Tensors = []ggufwrite.Tensor{
			{Name: "m", Type: ggufwrite.F32, Dims: []uint64{3, 2}, Data: ggufwrite.EncodeF32([]float32{1, 2, 3, 4, 5, 6})},
			{Name: "q", Type: ggufwrite.Q8_0, Dims: []uint64{32}, Data: odd},
			{Name: "v", Type: ggufwrite.BF16, Dims: []uint64{5}, Data: make([]byte, 10)},
		}
		f, err := gguf.Parse("rt.gguf", w.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		wantAlign := max(align, gguf.DefaultAlignment)
		if f.Version != 3 || f.Alignment != wantAlign {
			t.Errorf("version %d alignment %d", f.Version, f.Alignment)
		}
		u := func(k string) uint64 { v, _ := f.Meta.Get(k); x, _ := v.Uint(); return x }
		i := func(k string) int64 { v, _ := f.Meta.Get(k); x, _ := v.Int(); return x }
		fl := func(k string) float64 { v, _ := f.Meta.Get(k); x, _ := v.Float(); return x }
		b, _ := f.Meta.Get("bool")
		bv, _ := b.Bool()
		strs, _ := mustGet(t, f, "strs").Strings()
		ints, _ := mustGet(t, f, "i32s").Ints()
		floats, _ := mustGet(t, f, "f32s").Floats()
		if u("u8") != 9 || i("i8") != -7 || u("u16") != 700 || i("i16") != -700 || u("u32") != 70000 || i("i32") != -70000 ||
			fl("f32") != 1.5 || !bv || f.Meta.String("str") != "ferrite" || u("u64") != 1<<40 || i("i64") != -1<<40 || fl("f64") != 2.25 ||
			!slices.Equal(strs, []string{"a", "bc"}) || !slices.Equal(ints, []int64{1, -2}) || !slices.Equal(floats, []float64{0.5, -1}) {
			t.Errorf("metadata read back wrong: %v", f.Meta.Keys())
		}
		if n := len(f.Meta.Keys()); n != len(w.KV) {
			t.Errorf("%d keys, wrote %d", n, len(w.KV))
		}
		for k, tn := range f.Tensors {
			want := w.Tensors[k]
			if tn.Name != want.Name || uint32(tn.Type) != want.Type || !slices.Equal(tn.Dims, want.Dims) || !bytes.Equal(tn.Data, want.Data) {
				t.Errorf("tensor %d: %s %v %v", k, tn.Name, tn.Type, tn.Dims)
			}
			if tn.Offset%uint64(wantAlign) != 0 || (f.DataStart)%wantAlign != 0 {
				t.Errorf("tensor %s at offset %d (data at %d), alignment %d", tn.Name, tn.Offset, f.DataStart, wantAlign)
			}
		}
	}
}

func mustGet(t *testing.T, f *gguf.File, key string) gguf.Value {
	t.Helper()
	v, ok := f.Meta.Get(key)
	if !ok {
		t.Fatalf("no %s", key)
	}
	return v
}
