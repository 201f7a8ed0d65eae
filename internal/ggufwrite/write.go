// Package ggufwrite writes GGUF files: a plain encoder of the format
// (Writer), which tools/packtiny uses to write the built-in model's
// weights (builtin/model/model.gguf), and, for tests, a small converter
// from the transformers fixtures (Convert) that names, stacks and permutes
// tensors the way llama.cpp's convert_hf_to_gguf.py does. It is independent
// of package engine/gguf, so that the reader is checked against a second
// implementation (its own tests read back what it writes with that reader).
package ggufwrite

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// GGML tensor types (ggml.h's ggml_type) written here.
const (
	F32  = 0
	F16  = 1
	Q4_0 = 2
	Q8_0 = 8
	Q4K  = 12
	Q5K  = 13
	Q6K  = 14
	BF16 = 30
)

// KV is one metadata pair. Value is a uint8, int8, uint16, int16, uint32,
// int32, float32, bool, string, uint64, int64, float64, or a slice of one
// of those ([]string, []int32, []float32, ...).
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor: Dims are GGML's ne (innermost first), Data the
// encoded bytes, or (Data nil) Lazy returns them when the file is written,
// Size bytes: a converted model's stacked experts, too large to hold all
// at once.
type Tensor struct {
	Name string
	Type uint32
	Dims []uint64
	Data []byte
	Lazy func() ([]byte, error)
	Size int
}

// size is the length of t's encoded bytes.
func (t *Tensor) size() int {
	if t.Data == nil && t.Lazy != nil {
		return t.Size
	}
	return len(t.Data)
}

// Bytes returns t's encoded bytes, calling Lazy for a lazy tensor.
func (t *Tensor) Bytes() ([]byte, error) {
	if t.Data != nil || t.Lazy == nil {
		return t.Data, nil
	}
	b, err := t.Lazy()
	if err == nil && len(b) != t.Size {
		err = fmt.Errorf("ggufwrite: %s encodes to %d bytes, want %d", t.Name, len(b), t.Size)
	}
	return b, err
}

// Writer collects a file's contents.
type Writer struct {
	Version   uint32 // 3 when 0
	KV        []KV
	Tensors   []Tensor
	Alignment int // 32 when 0 (write general.alignment to change the reader's)
}

// Add appends a metadata pair.
func (w *Writer) Add(key string, v any) { w.KV = append(w.KV, KV{key, v}) }

// Set replaces (or appends) a metadata pair.
func (w *Writer) Set(key string, v any) {
	for i := range w.KV {
		if w.KV[i].Key == key {
			w.KV[i].Value = v
			return
		}
	}
	w.Add(key, v)
}

// Bytes encodes the file (lazy tensors included). It panics if a lazy
// tensor fails: use WriteTo for those.
func (w *Writer) Bytes() []byte {
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// WriteTo writes the file to out, encoding one lazy tensor at a time.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	var b bytes.Buffer
	le := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	version := w.Version
	if version == 0 {
		version = 3
	}
	align := w.Alignment
	if align == 0 {
		align = 32
	}
	b.WriteString("GGUF")
	le(version)
	le(uint64(len(w.Tensors)))
	le(uint64(len(w.KV)))
	for _, kv := range w.KV {
		str(kv.Key)
		writeValue(&b, kv.Value)
	}
	offset := uint64(0)
	for _, t := range w.Tensors {
		str(t.Name)
		le(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			le(d)
		}
		le(t.Type)
		le(offset)
		offset += uint64(pad(t.size(), align))
	}
	b.Write(make([]byte, pad(b.Len(), align)-b.Len()))
	n, err := out.Write(b.Bytes())
	total := int64(n)
	for _, t := range w.Tensors {
		if err != nil {
			break
		}
		var data []byte
		if data, err = t.Bytes(); err != nil {
			break
		}
		n, err = out.Write(data)
		total += int64(n)
		if err == nil {
			n, err = out.Write(make([]byte, pad(len(data), align)-len(data)))
			total += int64(n)
		}
	}
	return total, err
}

func pad(n, a int) int { return (n + a - 1) / a * a }

// WriteFile writes the file to path, encoding one lazy tensor at a time.
func (w *Writer) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if _, err = w.WriteTo(bw); err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// valueType is the GGUF type tag of a Go value.
func valueType(v any) uint32 {
	switch v.(type) {
	case uint8:
		return 0
	case int8:
		return 1
	case uint16:
		return 2
	case int16:
		return 3
	case uint32:
		return 4
	case int32:
		return 5
	case float32:
		return 6
	case bool:
		return 7
	case string:
		return 8
	case uint64:
		return 10
	case int64:
		return 11
	case float64:
		return 12
	}
	return 9 // array
}

func writeValue(b *bytes.Buffer, v any) {
	t := valueType(v)
	binary.Write(b, binary.LittleEndian, t)
	writeBody(b, v)
}

func writeBody(b *bytes.Buffer, v any) {
	le := func(x any) { binary.Write(b, binary.LittleEndian, x) }
	switch x := v.(type) {
	case string:
		le(uint64(len(x)))
		b.WriteString(x)
	case bool:
		if x {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case uint8, int8, uint16, int16, uint32, int32, float32, uint64, int64, float64:
		le(x)
	case []string:
		le(uint32(8))
		le(uint64(len(x)))
		for _, s := range x {
			writeBody(b, s)
		}
	case []int32:
		le(uint32(5))
		le(uint64(len(x)))
		le(x)
	case []uint32:
		le(uint32(4))
		le(uint64(len(x)))
		le(x)
	case []float32:
		le(uint32(6))
		le(uint64(len(x)))
		le(x)
	case []bool:
		le(uint32(7))
		le(uint64(len(x)))
		for _, e := range x {
			writeBody(b, e)
		}
	default:
		panic(fmt.Sprintf("ggufwrite: unsupported value %T", v))
	}
}

// EncodeF32 encodes float32 values.
func EncodeF32(vals []float32) []byte {
	out := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// DecodeF32 decodes little-endian float32 bytes.
func DecodeF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// Find returns the tensor called name.
func (w *Writer) Find(name string) (Tensor, bool) {
	for _, t := range w.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}
