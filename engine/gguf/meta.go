package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// Metadata is a file's key-value pairs, in file order.
type Metadata struct {
	kv   map[string]Value
	keys []string
}

// Keys returns the keys in file order. The caller may modify the slice.
func (m Metadata) Keys() []string { return append([]string(nil), m.keys...) }

// Get returns the value of key.
func (m Metadata) Get(key string) (Value, bool) {
	v, ok := m.kv[key]
	return v, ok
}

// Value is one metadata value, a view into the file decoded on demand. For
// an array, Elem is the element type and Len the element count.
type Value struct {
	Type ValueType
	Elem ValueType
	Len  int
	raw  []byte // the encoded value (an array's elements, after type and count)
}

// Uint returns an unsigned or non-negative signed integer value.
func (v Value) Uint() (uint64, bool) {
	i, ok := intOf(v.Type, v.raw)
	if !ok || i < 0 && v.Type != TypeUint64 {
		return 0, false
	}
	return uint64(i), true
}

// Int returns an integer value of any width (a uint64 above MaxInt64 fails).
func (v Value) Int() (int64, bool) {
	i, ok := intOf(v.Type, v.raw)
	if ok && v.Type == TypeUint64 && i < 0 {
		return 0, false
	}
	return i, ok
}

// intOf decodes one integer of type t from b (false for a zero Value).
func intOf(t ValueType, b []byte) (int64, bool) {
	if len(b) < t.size() || t.size() == 0 {
		return 0, false
	}
	switch t {
	case TypeUint8:
		return int64(b[0]), true
	case TypeInt8:
		return int64(int8(b[0])), true
	case TypeUint16:
		return int64(binary.LittleEndian.Uint16(b)), true
	case TypeInt16:
		return int64(int16(binary.LittleEndian.Uint16(b))), true
	case TypeUint32:
		return int64(binary.LittleEndian.Uint32(b)), true
	case TypeInt32:
		return int64(int32(binary.LittleEndian.Uint32(b))), true
	case TypeUint64, TypeInt64:
		return int64(binary.LittleEndian.Uint64(b)), true
	}
	return 0, false
}

// Float returns a float or integer value as float64.
func (v Value) Float() (float64, bool) {
	if len(v.raw) < v.Type.size() {
		return 0, false
	}
	switch v.Type {
	case TypeFloat32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(v.raw))), true
	case TypeFloat64:
		return math.Float64frombits(binary.LittleEndian.Uint64(v.raw)), true
	}
	i, ok := v.Int()
	return float64(i), ok
}

// Bool returns a bool value.
func (v Value) Bool() (bool, bool) {
	if v.Type != TypeBool || len(v.raw) != 1 {
		return false, false
	}
	return v.raw[0] != 0, true
}

// Str returns a string value.
func (v Value) Str() (string, bool) {
	if v.Type != TypeString {
		return "", false
	}
	return string(v.raw), true
}

// Strings returns an array of strings.
func (v Value) Strings() ([]string, bool) {
	if v.Type != TypeArray || v.Elem != TypeString {
		return nil, false
	}
	out := make([]string, v.Len)
	b := v.raw
	for i := range out {
		n := binary.LittleEndian.Uint64(b) // lengths were checked by Parse
		out[i] = string(b[8 : 8+n])
		b = b[8+n:]
	}
	return out, true
}

// Ints returns an array of integers of any width.
func (v Value) Ints() ([]int64, bool) {
	if v.Type != TypeArray {
		return nil, false
	}
	s := v.Elem.size()
	if _, ok := intOf(v.Elem, make([]byte, 8)); !ok {
		return nil, false
	}
	out := make([]int64, v.Len)
	for i := range out {
		out[i], _ = intOf(v.Elem, v.raw[i*s:])
	}
	return out, true
}

// Bools returns an array of bools.
func (v Value) Bools() ([]bool, bool) {
	if v.Type != TypeArray || v.Elem != TypeBool {
		return nil, false
	}
	out := make([]bool, v.Len)
	for i := range out {
		out[i] = v.raw[i] != 0
	}
	return out, true
}

// Floats returns an array of numbers as float64.
func (v Value) Floats() ([]float64, bool) {
	if v.Type != TypeArray {
		return nil, false
	}
	s := v.Elem.size()
	if s == 0 || v.Elem == TypeBool {
		return nil, false
	}
	out := make([]float64, v.Len)
	for i := range out {
		out[i], _ = Value{Type: v.Elem, raw: v.raw[i*s : (i+1)*s]}.Float()
	}
	return out, true
}

// String formats the value for messages (long arrays abbreviated).
func (v Value) String() string {
	switch v.Type {
	case TypeString:
		s, _ := v.Str()
		if len(s) > 60 {
			s = s[:60] + "..."
		}
		return fmt.Sprintf("%q", s)
	case TypeBool:
		b, _ := v.Bool()
		return fmt.Sprint(b)
	case TypeFloat32, TypeFloat64:
		f, _ := v.Float()
		return fmt.Sprint(f)
	case TypeArray:
		return fmt.Sprintf("[%d × %s]", v.Len, v.Elem)
	}
	if v.Type == TypeUint64 {
		u, _ := v.Uint()
		return fmt.Sprint(u)
	}
	i, ok := v.Int()
	if !ok {
		return v.Type.String()
	}
	return fmt.Sprint(i)
}

// describe is "a <type> (<value>)" for errors.
func (v Value) describe() string {
	if v.Type == TypeArray {
		return "an array " + v.String()
	}
	return fmt.Sprintf("a %s (%s)", v.Type, v)
}

// metaErr is an error about a metadata key.
func (m Metadata) metaErr(file, key string, v Value, want string) error {
	return fmt.Errorf("%s: metadata %s is %s, want %s", file, key, v.describe(), want)
}

// lookup helpers for the architecture and tokenizer mappings: each returns
// whether the key is present and fails when it has the wrong type.

func (m Metadata) uintKey(file, key string) (uint64, bool, error) {
	v, ok := m.kv[key]
	if !ok {
		return 0, false, nil
	}
	u, ok := v.Uint()
	if !ok {
		return 0, true, m.metaErr(file, key, v, "a non-negative integer")
	}
	return u, true, nil
}

func (m Metadata) floatKey(file, key string) (float64, bool, error) {
	v, ok := m.kv[key]
	if !ok {
		return 0, false, nil
	}
	f, ok := v.Float()
	if !ok {
		return 0, true, m.metaErr(file, key, v, "a number")
	}
	return f, true, nil
}

func (m Metadata) boolKey(file, key string) (bool, bool, error) {
	v, ok := m.kv[key]
	if !ok {
		return false, false, nil
	}
	b, ok := v.Bool()
	if !ok {
		return false, true, m.metaErr(file, key, v, "a bool")
	}
	return b, true, nil
}

// String returns the string value of key, or "" when it is absent or not a
// string.
func (m Metadata) String(key string) string {
	s, _ := m.kv[key].Str()
	return s
}

// Arch is general.architecture.
func (m Metadata) Arch() string { return m.String("general.architecture") }

// FileType is the quantization the file was made with, as llama.cpp names
// it ("Q4_K_M", "Q8_0", "BF16", ...), from general.file_type; "" if absent.
func (m Metadata) FileType() string {
	u, ok := m.kv["general.file_type"].Uint()
	if !ok {
		return ""
	}
	if s, ok := fileTypes[u]; ok {
		return s
	}
	return fmt.Sprintf("type %d", u)
}

// hasPrefix reports whether any key starts with prefix.
func (m Metadata) hasPrefix(prefix string) bool {
	for _, k := range m.keys {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}
