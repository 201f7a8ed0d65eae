package weights

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

func TestFromBytes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	ts := []WriteTensor{
		Encode("a.weight", kernels.BF16, []int{3, 4}, vals(12, 1)),
		Encode("b.weight", kernels.F32, []int{2, 5}, vals(10, 2)),
		Encode("c", kernels.F16, []int{7}, vals(7, 3)),
	}
	mustWrite(t, path, ts, map[string]string{"format": "pt"})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := FromBytes("builtin:test", data)
	if err != nil {
		t.Fatal(err)
	}
	ref := mustOpen(t, path)
	if !slices.Equal(s.Names(), ref.Names()) {
		t.Fatalf("names %v, want %v", s.Names(), ref.Names())
	}
	if s.Dir() != "" || s.Metadata()["format"] != "pt" {
		t.Errorf("dir %q metadata %v", s.Dir(), s.Metadata())
	}
	for _, n := range ref.Names() {
		got, _ := s.Tensor(n)
		want, _ := ref.Tensor(n)
		if !slices.Equal(got.Shape, want.Shape) || got.Dtype != want.Dtype || !slices.Equal(got.Data, want.Data) {
			t.Errorf("%s: got %v %s, want %v %s", n, got.Shape, got.Dtype, want.Shape, want.Dtype)
		}
		// zero copy: the data is a view into the given bytes
		p := uintptr(unsafe.Pointer(unsafe.SliceData(got.Data)))
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
		if p < lo || p >= lo+uintptr(len(data)) {
			t.Errorf("%s: data is not a view into the input", n)
		}
		gf, err1 := s.Float32(n, want.Shape...)
		wf, err2 := ref.Float32(n, want.Shape...)
		if err1 != nil || err2 != nil || !slices.Equal(gf, wf) {
			t.Errorf("%s: Float32 %v %v", n, err1, err2)
		}
	}
	m, err := s.Mat("a.weight", 3, 4)
	if err != nil || m.DType != kernels.BF16 || m.Rows != 3 || m.Cols != 4 {
		t.Errorf("Mat: %+v %v", m, err)
	}
	_, err = s.Mat("a.weight", 4, 3)
	if err == nil || !strings.Contains(err.Error(), "builtin:test") {
		t.Errorf("shape error %v, want one naming builtin:test", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tensor("a.weight"); err == nil {
		t.Error("want an error after Close")
	}

	for _, bad := range [][]byte{nil, data[:7], data[:len(data)-1]} {
		if _, err := FromBytes("bad", bad); err == nil || !strings.Contains(err.Error(), "bad") {
			t.Errorf("%d bytes: error %v", len(bad), err)
		}
	}
}
