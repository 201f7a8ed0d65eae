// Package kernels holds ferrite's compute backends: the small Backend
// interface the engine calls for its heavy operations, the weight matrix type
// that keeps weights in their stored dtype, and the generic reference loops
// every fast path is checked against.
//
// The CPU backend (package kernels/cpu) is the golden reference; a CUDA
// backend is checked against it. Every backend runs the shared conformance
// suite in package kernels/kerneltest.
package kernels

// DType is the storage type of a weight matrix.
type DType uint8

const (
	F32    DType = iota // IEEE float32, little-endian
	BF16                // bfloat16, little-endian
	F16                 // IEEE float16, little-endian
	F8E4M3              // float8 e4m3fn with per-block float32 scales

	// Block-quantized types in GGML's block layouts (a row of Cols elements
	// is Cols/BlockElems() blocks of BlockBytes() bytes each); Cols must be a
	// multiple of BlockElems().
	Q8_0 // 32 int8 + one f16 scale
	Q4_0 // 32 4-bit + one f16 scale, offset -8
	Q4K  // 256-element super-block: 8 sub-blocks with 6-bit scales and mins
	Q5K  // as Q4K with a fifth bit per weight
	Q6K  // 256-element super-block: 16 sub-blocks with int8 scales
)

// String returns the safetensors spelling of the dtype.
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case F8E4M3:
		return "F8_E4M3"
	case Q8_0:
		return "Q8_0"
	case Q4_0:
		return "Q4_0"
	case Q4K:
		return "Q4_K"
	case Q5K:
		return "Q5_K"
	case Q6K:
		return "Q6_K"
	case I32:
		return "I32"
	}
	return "unknown"
}

// Quantized reports whether d is a block-quantized type.
func (d DType) Quantized() bool { return d >= Q8_0 && d <= Q6K }

// BlockElems is how many elements one block holds (1 for plain types).
func (d DType) BlockElems() int {
	switch d {
	case Q8_0, Q4_0:
		return 32
	case Q4K, Q5K, Q6K:
		return 256
	}
	return 1
}

// BlockBytes is how many bytes one block takes (Size() for plain types).
func (d DType) BlockBytes() int {
	switch d {
	case Q8_0:
		return 34
	case Q4_0:
		return 18
	case Q4K:
		return 144
	case Q5K:
		return 176
	case Q6K:
		return 210
	}
	return d.Size()
}

// ScaleOffsets is where a block-quantized type's float16 scales sit in its
// block: d, and for Q4_K and Q5_K dmin after it (nil for plain types).
func (d DType) ScaleOffsets() []int {
	switch d {
	case Q8_0, Q4_0:
		return []int{0}
	case Q4K, Q5K:
		return []int{0, 2}
	case Q6K:
		return []int{208}
	}
	return nil
}

// RowBytes is how many bytes a row of cols elements takes; cols must be a
// multiple of BlockElems().
func (d DType) RowBytes(cols int) int { return cols / d.BlockElems() * d.BlockBytes() }

// Size is the number of bytes one element takes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	case F8E4M3:
		return 1
	}
	return 0
}

// Mat is a row-major 2-D weight matrix kept in its stored dtype, usually a
// view into a memory-mapped safetensors file. A linear layer's weight is
// stored (out, in), PyTorch's layout, so Rows is the output width.
type Mat struct {
	DType      DType
	Rows, Cols int
	Data       []byte // (Rows, Cols) elements of DType, little-endian

	// F8E4M3 only: Scale holds (ceil(Rows/BlockRows), ceil(Cols/BlockCols))
	// float32 multipliers (a checkpoint's weight_scale_inv).
	Scale                []float32
	BlockRows, BlockCols int

	// Transient marks a matrix whose Data changes between calls (activations
	// viewed as a matrix, such as attention's gathered keys): a backend that
	// keeps device copies of weights must read it afresh on every call.
	Transient bool

	// Random, when set, says the values are the seeded pseudo-random bytes
	// it describes (engine/randweights). Data may then be nil until
	// Materialize: a backend that generates them where it keeps its copy
	// (kernels.RandomGenerator) never needs them on the host.
	Random *RandomFill

	// KVB, on an MLA kv_b_proj whose file stores it already split per
	// head (a GGUF's attn_k_b and attn_v_b), is that split in its stored
	// dtype; Data still holds the whole matrix.
	KVB *KVBHeads
}

// KVBHeads is an MLA kv_b_proj split per head as the absorbed form uses
// it, views of a file's tensors (Mat.KVB): UK[h] (KVLora, Nope) is
// W_UK_hᵀ, UV[h] (V, KVLora) is W_UV_h. A backend may multiply by them
// instead of splitting the matrix itself: a GGUF's blocks stay blocks
// (the CPU's split of a block-quantized kv_b_proj would be float32).
type KVBHeads struct {
	UK, UV []*Mat
}
