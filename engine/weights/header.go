package weights

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
)

// maxHeader bounds a header's length, as the reference implementation does.
const maxHeader = 100 << 20

// headerEntry is one tensor's record in a safetensors header.
type headerEntry struct {
	Dtype       *string        `json:"dtype"`
	Shape       *[]json.Number `json:"shape"`
	DataOffsets *[]json.Number `json:"data_offsets"`
}

// parseFile parses the safetensors file whose whole contents are buf (path
// names it in errors). The returned tensors' Data are views into buf.
func parseFile(path string, buf []byte) ([]*Tensor, map[string]string, error) {
	if len(buf) < 8 {
		return nil, nil, fmt.Errorf("%s: file is %d bytes, too short for a safetensors header", path, len(buf))
	}
	n := binary.LittleEndian.Uint64(buf)
	rest := uint64(len(buf) - 8)
	switch {
	case n > maxHeader:
		return nil, nil, fmt.Errorf("%s: header length %d exceeds the %d-byte limit (not a safetensors file?)", path, n, maxHeader)
	case n > rest:
		return nil, nil, fmt.Errorf("%s: header length %d runs past the end of the file (%d bytes follow the length; truncated?)", path, n, rest)
	case n < 2:
		return nil, nil, fmt.Errorf("%s: header length %d is too small for a JSON object", path, n)
	}
	hdr, data := buf[8:8+n], buf[8+n:]

	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	jsonErr := func(err error) error {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%s: header is not valid JSON (at byte %d of the header): %v", path, se.Offset, err)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%s: header is not valid JSON: unexpected end of the header", path)
		}
		return fmt.Errorf("%s: header is not valid JSON: %v", path, err)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, jsonErr(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, fmt.Errorf("%s: header is not a JSON object (it starts with %v)", path, tok)
	}

	type span struct {
		t          *Tensor
		begin, end uint64
	}
	var (
		spans []span
		meta  map[string]string
		seen  = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, jsonErr(err)
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, nil, fmt.Errorf("%s: header names tensor %q twice", path, name)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&meta); err != nil {
				var se *json.SyntaxError
				if errors.As(err, &se) {
					return nil, nil, jsonErr(err)
				}
				return nil, nil, fmt.Errorf("%s: header __metadata__ is not an object of strings: %v", path, err)
			}
			continue
		}
		var e headerEntry
		if err := dec.Decode(&e); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, nil, jsonErr(err)
			}
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				what, want := "header entry", "an object"
				switch te.Field {
				case "dtype":
					what, want = "dtype", "a string"
				case "shape", "data_offsets":
					what, want = te.Field, "an array of integers"
				}
				return nil, nil, fmt.Errorf("%s: tensor %q: %s is a JSON %s, want %s", path, name, what, te.Value, want)
			}
			return nil, nil, fmt.Errorf("%s: tensor %q: malformed header entry: %v", path, name, err)
		}
		t, begin, end, err := checkEntry(path, name, &e)
		if err != nil {
			return nil, nil, err
		}
		if end > uint64(len(data)) {
			return nil, nil, fmt.Errorf("%s: tensor %q: data_offsets [%d %d] run past the end of the data (%d bytes; file truncated?)", path, name, begin, end, len(data))
		}
		t.Data = data[begin:end:end]
		spans = append(spans, span{t, begin, end})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, nil, jsonErr(err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, nil, jsonErr(err)
		}
		return nil, nil, fmt.Errorf("%s: header has data after its JSON object (%v)", path, tok)
	}

	slices.SortFunc(spans, func(a, b span) int {
		if a.begin != b.begin {
			return cmp.Compare(a.begin, b.begin)
		}
		return cmp.Compare(a.end, b.end)
	})
	var prev *span
	for i := range spans {
		s := &spans[i]
		if s.begin == s.end {
			continue
		}
		if prev != nil && s.begin < prev.end {
			return nil, nil, fmt.Errorf("%s: tensors %q (data_offsets [%d %d]) and %q (data_offsets [%d %d]) overlap",
				path, prev.t.Name, prev.begin, prev.end, s.t.Name, s.begin, s.end)
		}
		prev = s
	}
	tensors := make([]*Tensor, len(spans))
	for i, s := range spans {
		tensors[i] = s.t
	}
	return tensors, meta, nil
}

// checkEntry validates one header entry apart from its range in the file.
func checkEntry(path, name string, e *headerEntry) (t *Tensor, begin, end uint64, err error) {
	fail := func(format string, args ...any) (*Tensor, uint64, uint64, error) {
		return nil, 0, 0, fmt.Errorf("%s: tensor %q: "+format, append([]any{path, name}, args...)...)
	}
	if name == "" {
		return fail("empty tensor name")
	}
	if e.Dtype == nil {
		return fail("header entry has no dtype")
	}
	info, ok := lookupDtype(*e.Dtype)
	if !ok {
		return fail("unknown dtype %q (want one of %s)", *e.Dtype, validDtypeList())
	}
	if e.Shape == nil {
		return fail("header entry has no shape")
	}
	shape := make([]int, len(*e.Shape))
	for i, d := range *e.Shape {
		v, ok := jsonInt(d)
		if !ok || v > math.MaxInt {
			return fail("shape %v: dimension %d (%s) is not an integer", *e.Shape, i, d)
		}
		if v < 0 {
			return fail("shape %v has a negative dimension", *e.Shape)
		}
		shape[i] = int(v)
	}
	numel, err := numelOf(shape)
	if err != nil {
		return fail("shape %v: %v", shape, err)
	}
	size, err := byteSize(info, numel)
	if err != nil {
		return fail("shape %v of %s: %v", shape, *e.Dtype, err)
	}
	if e.DataOffsets == nil {
		return fail("header entry has no data_offsets")
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return fail("data_offsets %v: want [begin end]", offs)
	}
	var be [2]uint64
	for i, o := range offs {
		v, ok := jsonInt(o)
		if !ok || v < 0 {
			return fail("data_offsets %v: %s is not a non-negative integer", offs, o)
		}
		be[i] = uint64(v)
	}
	begin, end = be[0], be[1]
	if end < begin {
		return fail("data_offsets [%d %d] end before they begin", begin, end)
	}
	if end-begin != size {
		return fail("data_offsets [%d %d] span %d bytes, want %d (shape %v of %s)", begin, end, end-begin, size, shape, *e.Dtype)
	}
	t = &Tensor{Name: name, File: path, Dtype: *e.Dtype, DType: info.kd, Shape: shape}
	return t, begin, end, nil
}

// jsonInt parses a JSON number that holds an integer, also when it is
// written as a float such as 1e5 or 4.0.
func jsonInt(n json.Number) (int64, bool) {
	if v, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return v, true
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}
