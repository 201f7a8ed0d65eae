package gguf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/engine/weights"
)

// Model is an opened GGUF model: one file, or every part of a split one,
// memory-mapped read-only. It is safe for concurrent reads. Its metadata
// values and tensor data are views of the mapping: Close unmaps the files,
// after which neither may be used (what the accessors return, such as
// Meta.String or Value.Strings, are copies and stay valid).
type Model struct {
	Path    string   // the file given to Open (the first part of a split model), or FromBytes's name
	Parts   []string // every file, in order (none for FromBytes)
	Meta    Metadata // the first part's metadata
	tensors map[string]*TensorInfo
	names   []string // in file order
	unmaps  []func() error
	size    int64 // FromBytes: the data's length (Open's files are measured by Size)
	closed  atomic.Bool
}

// splitName matches the parts of a split model: NAME-00001-of-00003.gguf.
var splitName = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// SplitPart parses a split model's file name: the part number (1-based)
// and the count; ok is false for a file that is not named as a part.
func SplitPart(path string) (part, count int, ok bool) {
	m := splitName.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return 0, 0, false
	}
	part, _ = strconv.Atoi(m[2])
	count, _ = strconv.Atoi(m[3])
	return part, count, part >= 1 && part <= count
}

// splitPath is the name of part i (1-based) of the split model path belongs to.
func splitPath(path string, i, count int) string {
	m := splitName.FindStringSubmatch(filepath.Base(path))
	return filepath.Join(filepath.Dir(path), fmt.Sprintf("%s-%05d-of-%05d.gguf", m[1], i, count))
}

// Open maps and parses the GGUF file path. A file named as a part of a split
// model (NAME-0000N-of-0000M.gguf, any N) opens all M parts, which must
// agree with their split.no and split.count metadata.
func Open(path string) (_ *Model, err error) {
	paths := []string{path}
	if _, count, ok := SplitPart(path); ok {
		paths = paths[:0]
		for i := 1; i <= count; i++ {
			paths = append(paths, splitPath(path, i, count))
		}
	}
	m := &Model{Path: paths[0], Parts: paths, tensors: map[string]*TensorInfo{}}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	for i, p := range paths {
		data, unmap, err := weights.MapFile(p)
		if err != nil {
			return nil, err
		}
		m.unmaps = append(m.unmaps, unmap)
		f, err := Parse(p, data)
		if err != nil {
			return nil, err
		}
		if err := checkSplit(f, i, len(paths)); err != nil {
			return nil, err
		}
		if i == 0 {
			m.Meta = f.Meta
		}
		if err := m.add(f); err != nil {
			return nil, err
		}
	}
	if n, ok, err := m.Meta.uintKey(m.Path, "split.tensors.count"); err != nil {
		return nil, err
	} else if ok && n != uint64(len(m.names)) {
		return nil, fmt.Errorf("%s: split.tensors.count is %d, but the %d parts hold %d tensors: %w", m.Path, n, len(paths), len(m.names), ErrCount)
	}
	return m, nil
}

// FromBytes parses a whole GGUF file held in memory, such as the model
// built into the binary (package builtin, embedded with go:embed); name
// labels it in errors. The Model views data in place, which must stay
// unchanged while it is used; Close releases nothing. A part of a split
// model is refused.
func FromBytes(name string, data []byte) (*Model, error) {
	f, err := Parse(name, data)
	if err != nil {
		return nil, err
	}
	if err := checkSplit(f, 0, 1); err != nil {
		return nil, err
	}
	m := &Model{Path: name, Meta: f.Meta, tensors: map[string]*TensorInfo{}, size: int64(len(data))}
	if err := m.add(f); err != nil {
		return nil, err
	}
	return m, nil
}

// add registers the tensors of one part.
func (m *Model) add(f *File) error {
	for _, t := range f.Tensors {
		if _, dup := m.tensors[t.Name]; dup {
			return fmt.Errorf("%s: tensor %q is also in an earlier part: %w", f.Name, t.Name, ErrDuplicate)
		}
		m.tensors[t.Name] = t
		m.names = append(m.names, t.Name)
	}
	return nil
}

// checkSplit checks part i (0-based) of n against its split.* metadata.
func checkSplit(f *File, i, n int) error {
	count, hasCount, err := f.Meta.uintKey(f.Name, "split.count")
	if err != nil {
		return err
	}
	no, hasNo, err := f.Meta.uintKey(f.Name, "split.no")
	if err != nil {
		return err
	}
	switch {
	case n == 1 && hasCount && count > 1:
		return fmt.Errorf("%s: part of a model split in %d files (split.count), but not named NAME-0000N-of-%05d.gguf", f.Name, count, count)
	case n > 1 && (!hasCount || count != uint64(n)):
		return fmt.Errorf("%s: named as one of %d parts, but split.count is %s", f.Name, n, f.Meta.kv["split.count"])
	case n > 1 && (!hasNo || no != uint64(i)):
		return fmt.Errorf("%s: part %d of %d, but split.no is %s (counted from 0)", f.Name, i+1, n, f.Meta.kv["split.no"])
	}
	return nil
}

// Close unmaps the files. It is idempotent.
func (m *Model) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, u := range m.unmaps {
		errs = append(errs, u())
	}
	m.unmaps = nil
	return errors.Join(errs...)
}

// Tensor returns the named tensor's descriptor.
func (m *Model) Tensor(name string) (*TensorInfo, bool) {
	t, ok := m.tensors[name]
	return t, ok
}

// TensorNames returns the tensor names in file order.
func (m *Model) TensorNames() []string { return append([]string(nil), m.names...) }

// Size is the total size of the files in bytes (of the data, for FromBytes).
func (m *Model) Size() int64 {
	n := m.size
	for _, p := range m.Parts {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// Quantization names the weights' quantization: general.file_type when the
// file has it ("Q4_K_M"), else the type most of the matrices' bytes have.
func (m *Model) Quantization() string {
	if s := m.Meta.FileType(); s != "" {
		return s
	}
	bytes := map[GGMLType]int{}
	best := GGMLType(0)
	for _, t := range m.tensors {
		if len(t.Dims) >= 2 {
			bytes[t.Type] += len(t.Data)
			if bytes[t.Type] > bytes[best] {
				best = t.Type
			}
		}
	}
	return best.String()
}

// IsGGUF reports whether the file at path starts with the GGUF magic.
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	_, err = io.ReadFull(f, b[:])
	return err == nil && string(b[:]) == Magic
}

// IsProjector reports whether a file name is a vision projector shipped
// next to a GGUF language model (mmproj-*.gguf, *-mmproj.gguf).
func IsProjector(path string) bool {
	return strings.Contains(strings.ToLower(filepath.Base(path)), "mmproj")
}

// Find is the GGUF model at path: path itself when it is a GGUF file, or
// the one model among the *.gguf files of the directory path (a split
// model counts once, by its first part; vision projectors are skipped).
// ok is false when path is neither; an error says why a directory holding
// GGUF files names no single model.
func Find(path string) (file string, ok bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", false, nil
	}
	if fi.Mode().IsRegular() {
		return path, IsGGUF(path), nil
	}
	if !fi.IsDir() {
		return "", false, nil
	}
	models := ModelFiles(path)
	switch len(models) {
	case 0:
		return "", false, nil
	case 1:
		return models[0], true, nil
	}
	names := make([]string, len(models))
	for i, p := range models {
		names[i] = filepath.Base(p)
	}
	return "", true, fmt.Errorf("%s holds %d GGUF models (%s): give the file", path, len(models), strings.Join(names, ", "))
}

// ModelFiles lists the GGUF language models directly in dir: every *.gguf
// file but vision projectors and the parts after the first of a split model.
func ModelFiles(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(strings.ToLower(n), ".gguf") || IsProjector(n) {
			continue
		}
		p := filepath.Join(dir, n)
		if part, _, split := SplitPart(p); split && part != 1 {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			out = append(out, p)
		}
	}
	return out
}
