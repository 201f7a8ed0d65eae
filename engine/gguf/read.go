package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// Errors a malformed file is reported with (wrapped with the file, the key or
// tensor and the numbers at fault; test with errors.Is).
var (
	ErrNotGGUF   = errors.New("not a GGUF file")
	ErrVersion   = errors.New("unsupported GGUF version")
	ErrTruncated = errors.New("file truncated")
	ErrCount     = errors.New("count larger than the rest of the file (truncated or corrupt)")
	ErrString    = errors.New("bad string")
	ErrType      = errors.New("unknown type")
	ErrOffset    = errors.New("bad tensor data offset")
	ErrOverflow  = errors.New("size overflows")
	ErrShape     = errors.New("bad tensor shape")
	ErrDuplicate = errors.New("duplicate name")
	ErrAlignment = errors.New("bad general.alignment")
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the tensor data alignment when general.alignment is
// absent.
const DefaultAlignment = 32

// maxDims is the most dimensions a GGML tensor has.
const maxDims = 4

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The metadata value types of GGUF v2/v3.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// size is the encoded size of a fixed-size value; 0 for strings and arrays.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the fewest bytes one value of type t takes.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8 // the length
	case TypeArray:
		return 12 // element type and count
	}
	return t.size()
}

// File is a parsed GGUF file: its metadata and tensor descriptors, with
// views into data, the whole file.
type File struct {
	Name      string // names the file in errors
	Version   uint32
	Meta      Metadata
	Tensors   []*TensorInfo // in file order
	Alignment int
	DataStart int // offset of the tensor data section
}

// TensorInfo describes one tensor and views its data.
type TensorInfo struct {
	Name string
	// Dims are GGML's ne: Dims[0] is the innermost (contiguous) dimension.
	Dims   []uint64
	Type   GGMLType
	Offset uint64 // relative to the data section, as stored
	Data   []byte // the tensor's bytes inside the file
}

// Shape returns the dimensions outermost first (PyTorch's order): a GGML
// matrix with ne = [in, out] is a row-major [out, in] matrix.
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(s)-1-i] = int(d)
	}
	return s
}

// Numel is the number of elements.
func (t *TensorInfo) Numel() int {
	n := 1
	for _, d := range t.Dims {
		n *= int(d)
	}
	return n
}

// reader walks a byte slice, reporting a short read as ErrTruncated with
// what was being read.
type reader struct {
	name string
	data []byte
	pos  int
}

func (r *reader) fail(what string, need int) error {
	return fmt.Errorf("%s: %s at offset %d needs %d bytes, %d left: %w", r.name, what, r.pos, need, len(r.data)-r.pos, ErrTruncated)
}

func (r *reader) bytes(n int, what string) ([]byte, error) {
	if n < 0 || n > len(r.data)-r.pos {
		return nil, r.fail(what, n)
	}
	b := r.data[r.pos : r.pos+n : r.pos+n]
	r.pos += n
	return b, nil
}

func (r *reader) u32(what string) (uint32, error) {
	b, err := r.bytes(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64(what string) (uint64, error) {
	b, err := r.bytes(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// count reads a u64 count of items each at least minSize bytes long, and
// checks that the rest of the file could hold them.
func (r *reader) count(what string, minSize int) (int, error) {
	n, err := r.u64(what)
	if err != nil {
		return 0, err
	}
	left := uint64(len(r.data) - r.pos)
	if minSize > 0 && n > left/uint64(minSize) || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s: %s is %d, but %d bytes are left: %w", r.name, what, n, left, ErrCount)
	}
	return int(n), nil
}

// str reads a GGUF string (u64 length, bytes) without copying.
func (r *reader) str(what string) ([]byte, error) {
	n, err := r.u64(what + " length")
	if err != nil {
		return nil, err
	}
	if left := uint64(len(r.data) - r.pos); n > left {
		return nil, fmt.Errorf("%s: %s at offset %d claims %d bytes, %d left: %w", r.name, what, r.pos, n, left, ErrString)
	}
	return r.bytes(int(n), what)
}

// skipString steps over element i of the string array key.
func (r *reader) skipString(key string, i int) error {
	if len(r.data)-r.pos < 8 {
		return r.fail(fmt.Sprintf("%s[%d] length", key, i), 8)
	}
	n := binary.LittleEndian.Uint64(r.data[r.pos:])
	if left := uint64(len(r.data) - r.pos - 8); n > left {
		return fmt.Errorf("%s: %s[%d] at offset %d claims %d bytes, %d left: %w", r.name, key, i, r.pos, n, left, ErrString)
	}
	r.pos += 8 + int(n)
	return nil
}

// Parse reads and validates a GGUF file held in data (usually a memory
// mapping); name labels it in errors. The File's tensors and metadata view
// data, which must stay unchanged while they are used.
func Parse(name string, data []byte) (*File, error) {
	r := &reader{name: name, data: data}
	magic, err := r.bytes(4, "magic")
	if err != nil {
		return nil, fmt.Errorf("%s: %d bytes: %w", name, len(data), ErrNotGGUF)
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("%s: starts with %q, want %q: %w", name, magic, Magic, ErrNotGGUF)
	}
	f := &File{Name: name, Alignment: DefaultAlignment}
	if f.Version, err = r.u32("version"); err != nil {
		return nil, err
	}
	if f.Version != 2 && f.Version != 3 {
		if bits.ReverseBytes32(f.Version) <= 3 {
			return nil, fmt.Errorf("%s: a big-endian GGUF file (version %d), which ferrite does not read: %w", name, bits.ReverseBytes32(f.Version), ErrVersion)
		}
		return nil, fmt.Errorf("%s: version %d, want 2 or 3: %w", name, f.Version, ErrVersion)
	}
	nTensors, err := r.count("tensor count", 8+4+4+8) // name length, dims, type, offset
	if err != nil {
		return nil, err
	}
	nKV, err := r.count("metadata count", 8+4) // key length, type
	if err != nil {
		return nil, err
	}
	if f.Meta, err = parseMetadata(r, nKV); err != nil {
		return nil, err
	}
	if v, ok := f.Meta.kv["general.alignment"]; ok {
		a, isInt := v.Uint()
		if !isInt || v.Type != TypeUint32 || a == 0 || a&(a-1) != 0 || a > 1<<20 {
			return nil, fmt.Errorf("%s: general.alignment is %s, want a power of two as uint32: %w", name, v, ErrAlignment)
		}
		f.Alignment = int(a)
	}
	if f.Tensors, err = parseTensorInfos(r, nTensors); err != nil {
		return nil, err
	}
	f.DataStart = alignUp(r.pos, f.Alignment)
	if err := f.placeTensors(data); err != nil {
		return nil, err
	}
	return f, nil
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }

// parseMetadata reads n key-value pairs.
func parseMetadata(r *reader, n int) (Metadata, error) {
	m := Metadata{kv: make(map[string]Value, n)}
	for i := range n {
		key, err := r.str(fmt.Sprintf("metadata key #%d", i))
		if err != nil {
			return m, err
		}
		if len(key) == 0 || !utf8.Valid(key) {
			return m, fmt.Errorf("%s: metadata key #%d %q is empty or not UTF-8: %w", r.name, i, key, ErrString)
		}
		k := string(key)
		if _, dup := m.kv[k]; dup {
			return m, fmt.Errorf("%s: metadata key %q: %w", r.name, k, ErrDuplicate)
		}
		t, err := r.u32("type of " + k)
		if err != nil {
			return m, err
		}
		v, err := readValue(r, ValueType(t), k, 0)
		if err != nil {
			return m, err
		}
		m.kv[k] = v
		m.keys = append(m.keys, k)
	}
	return m, nil
}

// readValue reads one value of type t, checking its structure; arrays may
// nest (depth counts the levels).
func readValue(r *reader, t ValueType, key string, depth int) (Value, error) {
	start := r.pos
	switch {
	case t.size() > 0:
		b, err := r.bytes(t.size(), key)
		return Value{Type: t, raw: b}, err
	case t == TypeString:
		b, err := r.str(key)
		return Value{Type: t, raw: b}, err
	case t == TypeArray:
		if depth > 2 {
			return Value{}, fmt.Errorf("%s: %s: arrays nested too deep: %w", r.name, key, ErrType)
		}
		et, err := r.u32(key + " element type")
		if err != nil {
			return Value{}, err
		}
		elem := ValueType(et)
		if elem.minSize() == 0 {
			return Value{}, fmt.Errorf("%s: %s: array of %s: %w", r.name, key, elem, ErrType)
		}
		n, err := r.count(key+" array length", elem.minSize())
		if err != nil {
			return Value{}, err
		}
		body := r.pos
		if s := elem.size(); s > 0 {
			if _, err := r.bytes(n*s, key); err != nil {
				return Value{}, err
			}
		} else if elem == TypeString { // tokenizer vocabularies: 100k+ strings, walked without allocating
			for i := range n {
				if err := r.skipString(key, i); err != nil {
					return Value{}, err
				}
			}
		} else {
			for i := range n {
				if _, err := readValue(r, elem, fmt.Sprintf("%s[%d]", key, i), depth+1); err != nil {
					return Value{}, err
				}
			}
		}
		return Value{Type: t, Elem: elem, Len: n, raw: r.data[body:r.pos:r.pos]}, nil
	}
	r.pos = start
	return Value{}, fmt.Errorf("%s: %s has value type %d: %w", r.name, key, uint32(t), ErrType)
}

// parseTensorInfos reads n tensor descriptors.
func parseTensorInfos(r *reader, n int) ([]*TensorInfo, error) {
	ts := make([]*TensorInfo, 0, n)
	seen := make(map[string]bool, n)
	for i := range n {
		nb, err := r.str(fmt.Sprintf("tensor #%d name", i))
		if err != nil {
			return nil, err
		}
		if len(nb) == 0 || !utf8.Valid(nb) {
			return nil, fmt.Errorf("%s: tensor #%d name %q is empty or not UTF-8: %w", r.name, i, nb, ErrString)
		}
		t := &TensorInfo{Name: string(nb)}
		if seen[t.Name] {
			return nil, fmt.Errorf("%s: tensor %q: %w", r.name, t.Name, ErrDuplicate)
		}
		seen[t.Name] = true
		nd, err := r.u32(t.Name + " dimension count")
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > maxDims {
			return nil, fmt.Errorf("%s: tensor %q has %d dimensions, want 1 to %d: %w", r.name, t.Name, nd, maxDims, ErrShape)
		}
		t.Dims = make([]uint64, nd)
		for d := range t.Dims {
			if t.Dims[d], err = r.u64(t.Name + " dimension"); err != nil {
				return nil, err
			}
		}
		typ, err := r.u32(t.Name + " type")
		if err != nil {
			return nil, err
		}
		t.Type = GGMLType(typ)
		if t.Offset, err = r.u64(t.Name + " offset"); err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// placeTensors checks every tensor's type, shape, size and offset against
// the file and sets its Data view.
func (f *File) placeTensors(data []byte) error {
	type span struct {
		start, end uint64
		name       string
	}
	spans := make([]span, 0, len(f.Tensors))
	fileSize := uint64(len(data))
	dataStart := uint64(f.DataStart)
	for _, t := range f.Tensors {
		size, err := t.byteSize()
		if err != nil {
			return fmt.Errorf("%s: tensor %q: %w", f.Name, t.Name, err)
		}
		if t.Offset%uint64(f.Alignment) != 0 {
			return fmt.Errorf("%s: tensor %q: offset %d is not a multiple of the alignment %d: %w", f.Name, t.Name, t.Offset, f.Alignment, ErrOffset)
		}
		start, c1 := bits.Add64(dataStart, t.Offset, 0)
		end, c2 := bits.Add64(start, size, 0)
		if c1 != 0 || c2 != 0 || start > fileSize || end > fileSize {
			return fmt.Errorf("%s: tensor %q: data [%d, %d) (offset %d + %d bytes) is past the end of the file (%d bytes): %w",
				f.Name, t.Name, start, start+size, t.Offset, size, fileSize, ErrOffset)
		}
		t.Data = data[start:end:end]
		spans = append(spans, span{start, end, t.Name})
	}
	slices.SortFunc(spans, func(a, b span) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		if p, s := spans[i-1], spans[i]; s.start < p.end {
			return fmt.Errorf("%s: tensors %q [%d, %d) and %q [%d, %d) overlap: %w", f.Name, p.name, p.start, p.end, s.name, s.start, s.end, ErrOffset)
		}
	}
	return nil
}

// byteSize is the tensor's size in bytes, checking the type, that the
// innermost dimension is whole blocks, and overflow.
func (t *TensorInfo) byteSize() (uint64, error) {
	ti, ok := t.Type.info()
	if !ok {
		return 0, fmt.Errorf("GGML type %d: %w", uint32(t.Type), ErrType)
	}
	if t.Dims[0]%uint64(ti.blockElems) != 0 {
		return 0, fmt.Errorf("innermost dimension %d of %s is not a multiple of its block size %d: %w", t.Dims[0], t.Type, ti.blockElems, ErrShape)
	}
	size := t.Dims[0] / uint64(ti.blockElems) * uint64(ti.blockBytes)
	n := uint64(1)
	for _, d := range t.Dims[1:] {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, fmt.Errorf("dims %v: %w", t.Dims, ErrOverflow)
		}
		n = lo
	}
	hi, lo := bits.Mul64(size, n)
	if hi != 0 || lo > math.MaxInt64 || t.Dims[0] > math.MaxInt32*64 || n > math.MaxInt32*64 {
		return 0, fmt.Errorf("dims %v of %s: %w", t.Dims, t.Type, ErrOverflow)
	}
	return lo, nil
}
