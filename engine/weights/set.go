package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Tensor is one tensor of a checkpoint, in its stored dtype.
type Tensor struct {
	Name string // e.g. "model.layers.0.self_attn.q_proj.weight"
	File string // the safetensors file it lives in; "" for an in-memory tensor

	// DType is the kernels' dtype for F32, BF16, F16 and F8_E4M3 tensors and
	// OtherDType for every other dtype; Dtype is the safetensors spelling
	// ("BF16", "I64", "U8", ...) and is always set.
	DType kernels.DType
	Dtype string

	Shape []int  // dims, outermost first; [] for a scalar
	Data  []byte // numel × element size bytes, little-endian; read-only (memory-mapped)
}

// Numel returns the number of elements, the product of Shape (1 for a scalar).
func (t *Tensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Set is the tensors of one checkpoint directory, memory-mapped.
type Set struct {
	dir     string // as given to Open; "" for an in-memory Set
	label   string // what errors name when no file is concerned
	tensors map[string]*Tensor
	names   []string
	meta    map[string]string
	files   []*mapping
	closed  atomic.Bool

	blockRows, blockCols int // F8 block size given by SetBlockSize, or 0
}

// Open memory-maps the checkpoint in dir: model.safetensors if present, else
// the shards named by model.safetensors.index.json, else every *.safetensors
// file in dir. Every header is validated; tensor names must be unique across
// files. dir may also name a single .safetensors file.
func Open(dir string) (*Set, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return openFiles(filepath.Dir(dir), []string{dir}, nil)
	}
	single := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		return openFiles(dir, []string{single}, nil)
	}
	index := filepath.Join(dir, "model.safetensors.index.json")
	if data, err := os.ReadFile(index); err == nil {
		return openIndex(dir, index, data)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, ".safetensors") && !strings.HasPrefix(n, ".") && !e.IsDir() {
			paths = append(paths, filepath.Join(dir, n))
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", dir)
	}
	return openFiles(dir, paths, nil)
}

// openIndex opens the shards a model.safetensors.index.json names and checks
// that each tensor of its weight_map is in the shard it names.
func openIndex(dir, index string, data []byte) (*Set, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := lineCol(data, se.Offset-1) // Offset counts the offending byte
			return nil, fmt.Errorf("%s:%d:%d: not valid JSON: %v", index, line, col, err)
		}
		return nil, fmt.Errorf("%s: %v", index, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: no weight_map (or it is empty)", index)
	}
	// One tensor per shard, to name in errors; shards in sorted order.
	byShard := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		shard := idx.WeightMap[name]
		if !filepath.IsLocal(shard) {
			return nil, fmt.Errorf("%s: tensor %q: shard %q is not a file inside %s", index, name, shard, dir)
		}
		if _, ok := byShard[shard]; !ok {
			byShard[shard] = name
		}
	}
	shards := slices.Sorted(maps.Keys(byShard))
	paths := make([]string, len(shards))
	for i, shard := range shards {
		paths[i] = filepath.Join(dir, shard)
		if _, err := os.Stat(paths[i]); err != nil {
			return nil, fmt.Errorf("%s: shard %q (holding tensor %q and maybe others): %v", index, shard, byShard[shard], err)
		}
	}
	check := func(s *Set) error {
		for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
			want := filepath.Join(dir, idx.WeightMap[name])
			t, ok := s.tensors[name]
			if !ok {
				return fmt.Errorf("%s: tensor %q is not in its shard %s", index, name, want)
			}
			if t.File != want {
				return fmt.Errorf("%s: tensor %q is in %s, not in its shard %s", index, name, t.File, want)
			}
		}
		return nil
	}
	return openFiles(dir, paths, check)
}

// openFiles maps and parses paths into one Set, then runs check, if any.
func openFiles(dir string, paths []string, check func(*Set) error) (_ *Set, err error) {
	s := &Set{dir: dir, label: dir, tensors: map[string]*Tensor{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for _, p := range paths {
		m, err := mapFile(p)
		if err != nil {
			return nil, err
		}
		s.files = append(s.files, m)
		ts, meta, err := parseFile(p, m.data)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			if prev, ok := s.tensors[t.Name]; ok {
				return nil, fmt.Errorf("%s: duplicate tensor %q, also in %s", p, t.Name, prev.File)
			}
			s.tensors[t.Name] = t
		}
		for k, v := range meta {
			if s.meta == nil {
				s.meta = map[string]string{}
			}
			if _, ok := s.meta[k]; !ok {
				s.meta[k] = v
			}
		}
	}
	s.names = slices.Sorted(maps.Keys(s.tensors))
	if check != nil {
		if err := check(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close unmaps the files. Data slices taken from the Set must not be used
// afterwards. Close is idempotent.
func (s *Set) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, m := range s.files {
		if err := m.close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", m.path, err))
		}
	}
	s.files = nil
	return errors.Join(errs...)
}

// Dir returns the directory the Set was opened from ("" for an in-memory Set).
func (s *Set) Dir() string { return s.dir }

// Names returns the tensor names, sorted. The caller may modify the slice.
func (s *Set) Names() []string { return slices.Clone(s.names) }

// Has reports whether the Set has a tensor called name.
func (s *Set) Has(name string) bool {
	_, ok := s.tensors[name]
	return ok
}

// Metadata returns the files' __metadata__ (merged; the first file wins).
func (s *Set) Metadata() map[string]string {
	m := make(map[string]string, len(s.meta))
	for k, v := range s.meta {
		m[k] = v
	}
	return m
}

// SetBlockSize fixes the F8_E4M3 block size (for example from config.json's
// quantization_config.weight_block_size) instead of inferring it from each
// scale tensor's shape; Mat and Expert then check the scale shapes against it.
// Call it before the Set is shared between goroutines. Zeroes restore
// inference.
func (s *Set) SetBlockSize(rows, cols int) { s.blockRows, s.blockCols = rows, cols }

// Tensor returns the named tensor. The result is a copy of the Set's record
// (its Data still points into the mapping).
func (s *Set) Tensor(name string) (*Tensor, error) {
	t, err := s.tensor(name)
	if err != nil {
		return nil, err
	}
	c := *t
	c.Shape = slices.Clone(t.Shape)
	return &c, nil
}

func (s *Set) tensor(name string) (*Tensor, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("%s: tensor %q: the weights are closed", s.label, name)
	}
	t, ok := s.tensors[name]
	if !ok {
		return nil, fmt.Errorf("%s: missing tensor %q", s.label, name)
	}
	return t, nil
}

// where names a tensor's file in errors, or the Set for in-memory tensors.
func (s *Set) where(t *Tensor) string {
	if t.File != "" {
		return t.File
	}
	return s.label
}

// shapeErr is the error for a tensor whose shape is not the wanted one.
func (s *Set) shapeErr(t *Tensor, want string) error {
	return fmt.Errorf("%s: tensor %q has shape %v, want %s", s.where(t), t.Name, t.Shape, want)
}

func fmtShape(shape []int) string { return fmt.Sprint(shape) }

// Mat returns the 2-D tensor name, which must have shape [rows, cols] and a
// dtype the kernels handle, as a kernels.Mat viewing the mapped data. An
// F8_E4M3 tensor gets its block scales attached from "<name>_scale_inv" (or
// "<name>_scale"), converted to float32; the block size is inferred from
// the scale tensor's shape unless SetBlockSize fixed it.
func (s *Set) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	t, err := s.tensor(name)
	if err != nil {
		return nil, err
	}
	if len(t.Shape) != 2 || t.Shape[0] != rows || t.Shape[1] != cols {
		return nil, s.shapeErr(t, fmtShape([]int{rows, cols}))
	}
	return s.mat(t, -1, rows, cols)
}

// Expert returns expert e's [rows, cols] matrix of the fused 3-D tensor name,
// shaped [E, rows, cols] (Hugging Face's experts.gate_up_proj [E, 2I, H] and
// experts.down_proj [E, H, I]), as a kernels.Mat viewing the mapped data. An
// F8_E4M3 tensor's scales "<name>_scale_inv" must be [E, rows/blk, cols/blk].
func (s *Set) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	t, err := s.tensor(name)
	if err != nil {
		return nil, err
	}
	if len(t.Shape) != 3 || t.Shape[1] != rows || t.Shape[2] != cols {
		want := fmt.Sprintf("[E %d %d]", rows, cols)
		if len(t.Shape) == 3 {
			want = fmtShape([]int{t.Shape[0], rows, cols})
		}
		return nil, s.shapeErr(t, want)
	}
	if e < 0 || e >= t.Shape[0] {
		return nil, fmt.Errorf("%s: tensor %q has %d experts, want expert %d", s.where(t), t.Name, t.Shape[0], e)
	}
	return s.mat(t, e, rows, cols)
}

// mat builds the Mat view of t (expert e of a 3-D t, or all of a 2-D t when
// e < 0), whose shape has been checked.
func (s *Set) mat(t *Tensor, e, rows, cols int) (*kernels.Mat, error) {
	info, _ := lookupDtype(t.Dtype)
	if !info.kernel {
		return nil, fmt.Errorf("%s: tensor %q has dtype %s, want %s", s.where(t), t.Name, t.Dtype, kernelDtypes)
	}
	n := rows * cols * info.kd.Size()
	data := t.Data
	if e >= 0 {
		data = data[e*n : (e+1)*n : (e+1)*n]
	}
	m := &kernels.Mat{DType: info.kd, Rows: rows, Cols: cols, Data: data}
	if info.kd == kernels.F8E4M3 {
		if err := s.attachScales(m, t, e); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// scaleName returns the name of t's block-scale tensor, if it has one.
func (s *Set) scaleName(t *Tensor) (string, bool) {
	for _, n := range []string{t.Name + "_scale_inv", t.Name + "_scale"} {
		if _, ok := s.tensors[n]; ok {
			return n, true
		}
	}
	return t.Name + "_scale_inv", false
}

// attachScales sets m's Scale and block size from t's scale tensor (expert
// e's part of it when e >= 0).
func (s *Set) attachScales(m *kernels.Mat, t *Tensor, e int) error {
	sname, ok := s.scaleName(t)
	if !ok {
		return fmt.Errorf("%s: missing tensor %q (the block scales of F8_E4M3 tensor %q)", s.label, sname, t.Name)
	}
	st := s.tensors[sname]
	info, _ := lookupDtype(st.Dtype)
	if !info.float {
		return fmt.Errorf("%s: tensor %q (scales of %q) has dtype %s, want F32", s.where(st), sname, t.Name, st.Dtype)
	}
	var sr, sc int
	data := st.Data
	if e >= 0 {
		if len(st.Shape) != 3 || st.Shape[0] != t.Shape[0] {
			return s.shapeErr(st, fmt.Sprintf("[%d rowBlocks colBlocks] (scales of %q %v)", t.Shape[0], t.Name, t.Shape))
		}
		sr, sc = st.Shape[1], st.Shape[2]
		n := sr * sc * info.bits / 8
		data = data[e*n : (e+1)*n]
	} else {
		switch {
		case len(st.Shape) == 2:
			sr, sc = st.Shape[0], st.Shape[1]
		case len(st.Shape) == 0 || len(st.Shape) == 1 && st.Shape[0] == 1: // one per-tensor scale
			sr, sc = 1, 1
		case len(st.Shape) == 1 && st.Shape[0] == m.Rows: // one scale per row
			sr, sc = m.Rows, 1
		default:
			return s.shapeErr(st, fmt.Sprintf("[rowBlocks colBlocks] (scales of %q %v)", t.Name, t.Shape))
		}
	}
	br, okr := blockSize(m.Rows, sr, s.blockRows)
	bc, okc := blockSize(m.Cols, sc, s.blockCols)
	if !okr || !okc {
		want := "[ceil(rows/block) ceil(cols/block)]"
		if s.blockRows > 0 && s.blockCols > 0 {
			want = fmtShape([]int{ceilDiv(m.Rows, s.blockRows), ceilDiv(m.Cols, s.blockCols)})
			if e >= 0 {
				want = fmtShape([]int{t.Shape[0], ceilDiv(m.Rows, s.blockRows), ceilDiv(m.Cols, s.blockCols)})
			}
		}
		return s.shapeErr(st, fmt.Sprintf("%s for the blocks of %q %v", want, t.Name, t.Shape))
	}
	m.Scale = make([]float32, sr*sc)
	decodeFloats(st.Dtype, m.Scale, data)
	m.BlockRows, m.BlockCols = br, bc
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// blockSize finds the block length b with ceil(n/b) == blocks: hint when
// given, else 128 (the usual size) if it fits, else the smallest fitting power
// of two, else the smallest fitting length.
func blockSize(n, blocks, hint int) (int, bool) {
	fits := func(b int) bool { return b > 0 && ceilDiv(n, b) == blocks }
	if n == 0 {
		if hint > 0 {
			return hint, blocks == 0
		}
		return 128, blocks == 0
	}
	if hint > 0 {
		return hint, fits(hint)
	}
	if blocks <= 0 {
		return 0, false
	}
	if fits(128) {
		return 128, true
	}
	lo := ceilDiv(n, blocks)
	for b := 1; b > 0 && b <= 2*n; b <<= 1 {
		if b >= lo && fits(b) {
			return b, true
		}
	}
	return lo, fits(lo)
}

// Float32 converts the tensor name, whose shape must be exactly shape, from
// any float dtype (F32, BF16, F16, F8_E4M3 with its scales if it has them,
// F8_E5M2, F8_E8M0, F64) to a new []float32. It is meant for small tensors:
// norm weights, biases, router gates, A_log and the like.
func (s *Set) Float32(name string, shape ...int) ([]float32, error) {
	t, err := s.tensor(name)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(t.Shape, shape) {
		if shape == nil {
			shape = []int{}
		}
		return nil, s.shapeErr(t, fmtShape(shape))
	}
	info, _ := lookupDtype(t.Dtype)
	if !info.float {
		return nil, fmt.Errorf("%s: tensor %q has dtype %s, want a float dtype (%s, F8_E5M2, F8_E8M0 or F64)", s.where(t), t.Name, t.Dtype, kernelDtypes)
	}
	out := make([]float32, t.Numel())
	if _, scaled := s.scaleName(t); scaled && info.kd == kernels.F8E4M3 && len(t.Shape) == 2 {
		m, err := s.mat(t, -1, t.Shape[0], t.Shape[1])
		if err != nil {
			return nil, err
		}
		for r := range m.Rows {
			m.RowF32(out[r*m.Cols:(r+1)*m.Cols], r)
		}
		return out, nil
	}
	decodeFloats(t.Dtype, out, t.Data)
	return out, nil
}

// lineCol converts a byte offset into data to a 1-based line and column.
func lineCol(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	before := data[:off]
	line = 1 + strings.Count(string(before), "\n")
	col = int(off) - strings.LastIndexByte(string(before), '\n')
	return line, col
}
