package weights

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/kernels"
)

// WriteTensor is one tensor for WriteFile or FromMemory.
type WriteTensor struct {
	Name string
	// DType is the dtype when Dtype is empty; Dtype is the safetensors
	// spelling and is needed only for dtypes kernels.DType lacks ("I64", ...).
	DType kernels.DType
	Dtype string
	Shape []int  // dims, outermost first; [] or nil for a scalar
	Data  []byte // numel × element size bytes, little-endian
}

// dtype returns the safetensors spelling of w's dtype.
func (w *WriteTensor) dtype() string {
	if w.Dtype != "" {
		return w.Dtype
	}
	return dtypeName(w.DType)
}

// Encode makes a WriteTensor of the given dtype (F32, BF16, F16 or F8E4M3)
// from float32 values, rounding to nearest even (F8E4M3 saturates at ±448
// and is not scaled; see QuantizeF8 for block-scaled weights). It panics if
// len(vals) is not the shape's element count.
func Encode(name string, dt kernels.DType, shape []int, vals []float32) WriteTensor {
	t := NewTensor(dt, shape, vals)
	return WriteTensor{Name: name, DType: dt, Shape: t.Shape, Data: t.Data}
}

// NewTensor makes an in-memory Tensor (for NewMem) of the given dtype from
// float32 values, as Encode does. Its Name is set by NewMem.
func NewTensor(dt kernels.DType, shape []int, vals []float32) *Tensor {
	numel := 1
	for _, d := range shape {
		numel *= d
	}
	if len(vals) != numel {
		panic(fmt.Sprintf("weights: %d values for shape %v", len(vals), shape))
	}
	data := make([]byte, numel*dt.Size())
	switch dt {
	case kernels.F32:
		for i, v := range vals {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
	case kernels.BF16:
		for i, v := range vals {
			binary.LittleEndian.PutUint16(data[2*i:], kernels.F32ToBF16(v))
		}
	case kernels.F16:
		for i, v := range vals {
			binary.LittleEndian.PutUint16(data[2*i:], F32ToF16(v))
		}
	case kernels.F8E4M3:
		for i, v := range vals {
			data[i] = F32ToF8E4M3(v)
		}
	default:
		panic(fmt.Sprintf("weights: NewTensor of dtype %v", dt))
	}
	return &Tensor{DType: dt, Dtype: dt.String(), Shape: slices.Clone(shape), Data: data}
}

// QuantizeF8 quantises the row-major (rows, cols) matrix vals to F8_E4M3 in
// (blockRows, blockCols) blocks the way fp8 checkpoints are made: each block's
// scale is its largest magnitude / 448 (1 for an all-zero block), and
// weight = round(v / scale). It returns the weight tensor name and its
// float32 scale tensor name+"_scale_inv", shaped
// [ceil(rows/blockRows), ceil(cols/blockCols)].
func QuantizeF8(name string, rows, cols, blockRows, blockCols int, vals []float32) (weight, scale WriteTensor) {
	if len(vals) != rows*cols || blockRows <= 0 || blockCols <= 0 {
		panic(fmt.Sprintf("weights: QuantizeF8 of %d values as [%d %d] in [%d %d] blocks", len(vals), rows, cols, blockRows, blockCols))
	}
	sr, sc := ceilDiv(rows, blockRows), ceilDiv(cols, blockCols)
	scales := make([]float32, sr*sc)
	for r := range rows {
		for c := range cols {
			i := (r/blockRows)*sc + c/blockCols
			scales[i] = max(scales[i], float32(math.Abs(float64(vals[r*cols+c]))))
		}
	}
	for i, a := range scales {
		if a == 0 {
			scales[i] = 1
		} else {
			scales[i] = a / F8E4M3Max
		}
	}
	q := make([]byte, rows*cols)
	for r := range rows {
		for c := range cols {
			q[r*cols+c] = F32ToF8E4M3(vals[r*cols+c] / scales[(r/blockRows)*sc+c/blockCols])
		}
	}
	weight = WriteTensor{Name: name, DType: kernels.F8E4M3, Shape: []int{rows, cols}, Data: q}
	scale = Encode(name+"_scale_inv", kernels.F32, []int{sr, sc}, scales)
	return weight, scale
}

// checkWrite validates a tensor to be written or held in memory.
func checkWrite(name, dtype string, shape []int, data []byte) error {
	if name == "" || name == "__metadata__" {
		return fmt.Errorf("tensor name %q is not allowed", name)
	}
	info, ok := lookupDtype(dtype)
	if !ok {
		return fmt.Errorf("tensor %q: unknown dtype %q (want one of %s)", name, dtype, validDtypeList())
	}
	numel, err := numelOf(shape)
	if err != nil {
		return fmt.Errorf("tensor %q: shape %v: %v", name, shape, err)
	}
	size, err := byteSize(info, numel)
	if err != nil {
		return fmt.Errorf("tensor %q: shape %v of %s: %v", name, shape, dtype, err)
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("tensor %q: %d bytes of data, want %d (shape %v of %s)", name, len(data), size, shape, dtype)
	}
	return nil
}

// WriteFile writes tensors, in name order, and metadata (may be nil) to a
// safetensors file at path. Names must be unique.
func WriteFile(path string, tensors []WriteTensor, metadata map[string]string) (err error) {
	ts := slices.Clone(tensors)
	slices.SortFunc(ts, func(a, b WriteTensor) int { return strings.Compare(a.Name, b.Name) })
	var hdr strings.Builder
	hdr.WriteByte('{')
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata) // sorted keys
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		hdr.WriteString(`"__metadata__":`)
		hdr.Write(m)
	}
	var off uint64
	for i := range ts {
		w := &ts[i]
		if i > 0 && w.Name == ts[i-1].Name {
			return fmt.Errorf("%s: duplicate tensor %q", path, w.Name)
		}
		if err := checkWrite(w.Name, w.dtype(), w.Shape, w.Data); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		if hdr.Len() > 1 {
			hdr.WriteByte(',')
		}
		name, _ := json.Marshal(w.Name)
		hdr.Write(name)
		fmt.Fprintf(&hdr, `:{"dtype":%q,"shape":[`, w.dtype())
		for j, d := range w.Shape {
			if j > 0 {
				hdr.WriteByte(',')
			}
			hdr.WriteString(strconv.Itoa(d))
		}
		end := off + uint64(len(w.Data))
		fmt.Fprintf(&hdr, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 { // pad so the data starts 8-byte aligned
		hdr.WriteByte(' ')
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	bw.Write(n[:])
	bw.WriteString(hdr.String())
	for _, w := range ts {
		bw.Write(w.Data)
	}
	return bw.Flush()
}

// FromMemory builds a Set from in-memory tensors, validated as Open validates
// files. The Set uses the tensors' Data without copying.
func FromMemory(tensors []WriteTensor) (*Set, error) {
	s := &Set{label: "in-memory weights", tensors: make(map[string]*Tensor, len(tensors))}
	for _, w := range tensors {
		if err := checkWrite(w.Name, w.dtype(), w.Shape, w.Data); err != nil {
			return nil, fmt.Errorf("%s: %v", s.label, err)
		}
		if _, ok := s.tensors[w.Name]; ok {
			return nil, fmt.Errorf("%s: duplicate tensor %q", s.label, w.Name)
		}
		info, _ := lookupDtype(w.dtype())
		shape := w.Shape
		if shape == nil {
			shape = []int{}
		}
		s.tensors[w.Name] = &Tensor{Name: w.Name, DType: info.kd, Dtype: w.dtype(), Shape: slices.Clone(shape), Data: w.Data}
	}
	s.names = slices.Sorted(maps.Keys(s.tensors))
	return s, nil
}

// NewMem builds a Set from in-memory tensors keyed by name (see NewTensor).
// A tensor's Name, if set, must equal its key; Dtype may be left empty when
// DType says it. NewMem panics if a tensor is inconsistent (a programming
// error); FromMemory returns an error instead.
func NewMem(tensors map[string]*Tensor) *Set {
	ws := make([]WriteTensor, 0, len(tensors))
	for name, t := range tensors {
		if t.Name != "" && t.Name != name {
			panic(fmt.Sprintf("weights: NewMem: tensor %q stored under %q", t.Name, name))
		}
		w := WriteTensor{Name: name, DType: t.DType, Dtype: t.Dtype, Shape: t.Shape, Data: t.Data}
		ws = append(ws, w)
	}
	s, err := FromMemory(ws)
	if err != nil {
		panic("weights: NewMem: " + err.Error())
	}
	return s
}
