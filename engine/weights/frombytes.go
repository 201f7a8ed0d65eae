package weights

import (
	"fmt"
	"maps"
	"slices"
)

// FromBytes parses data, the whole contents of one safetensors file, into a
// Set without copying: the tensors' Data are views into data, which must stay
// unchanged while the Set is used (for example bytes embedded in the binary
// with go:embed). name labels the Set in errors (a file name, or something
// like "mem:model.safetensors"). The header is validated as Open validates
// files. Close is a no-op for such a Set apart from marking it closed.
func FromBytes(name string, data []byte) (*Set, error) {
	if name == "" {
		name = "in-memory safetensors"
	}
	ts, meta, err := parseFile(name, data)
	if err != nil {
		return nil, err
	}
	s := &Set{label: name, tensors: make(map[string]*Tensor, len(ts)), meta: meta}
	for _, t := range ts {
		if _, ok := s.tensors[t.Name]; ok {
			return nil, fmt.Errorf("%s: duplicate tensor %q", name, t.Name)
		}
		t.File = name
		s.tensors[t.Name] = t
	}
	s.names = slices.Sorted(maps.Keys(s.tensors))
	return s, nil
}
