package gguf

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
)

// GGMLType is a tensor's storage type (ggml.h's ggml_type).
type GGMLType uint32

// The GGML types ferrite's kernels use; the others are listed in ggmlTypes.
const (
	TypeF32  GGMLType = 0
	TypeF16  GGMLType = 1
	TypeQ4_0 GGMLType = 2
	TypeQ8_0 GGMLType = 8
	TypeQ4K  GGMLType = 12
	TypeQ5K  GGMLType = 13
	TypeQ6K  GGMLType = 14
	TypeBF16 GGMLType = 30
)

// typeInfo is one GGML type's block geometry and, when the kernels handle
// it, its kernels.DType.
type typeInfo struct {
	name                   string
	blockElems, blockBytes int
	kd                     kernels.DType
	kernel                 bool
}

// ggmlTypes is every type of ggml.h, so that files holding types ferrite
// does not compute with are still validated and named in errors.
var ggmlTypes = map[GGMLType]typeInfo{
	0:  {"F32", 1, 4, kernels.F32, true},
	1:  {"F16", 1, 2, kernels.F16, true},
	2:  {"Q4_0", 32, 18, kernels.Q4_0, true},
	3:  {name: "Q4_1", blockElems: 32, blockBytes: 20},
	6:  {name: "Q5_0", blockElems: 32, blockBytes: 22},
	7:  {name: "Q5_1", blockElems: 32, blockBytes: 24},
	8:  {"Q8_0", 32, 34, kernels.Q8_0, true},
	9:  {name: "Q8_1", blockElems: 32, blockBytes: 36},
	10: {name: "Q2_K", blockElems: 256, blockBytes: 84},
	11: {name: "Q3_K", blockElems: 256, blockBytes: 110},
	12: {"Q4_K", 256, 144, kernels.Q4K, true},
	13: {"Q5_K", 256, 176, kernels.Q5K, true},
	14: {"Q6_K", 256, 210, kernels.Q6K, true},
	15: {name: "Q8_K", blockElems: 256, blockBytes: 292},
	16: {name: "IQ2_XXS", blockElems: 256, blockBytes: 66},
	17: {name: "IQ2_XS", blockElems: 256, blockBytes: 74},
	18: {name: "IQ3_XXS", blockElems: 256, blockBytes: 98},
	19: {name: "IQ1_S", blockElems: 256, blockBytes: 50},
	20: {name: "IQ4_NL", blockElems: 32, blockBytes: 18},
	21: {name: "IQ3_S", blockElems: 256, blockBytes: 110},
	22: {name: "IQ2_S", blockElems: 256, blockBytes: 82},
	23: {name: "IQ4_XS", blockElems: 256, blockBytes: 136},
	24: {name: "I8", blockElems: 1, blockBytes: 1},
	25: {name: "I16", blockElems: 1, blockBytes: 2},
	26: {name: "I32", blockElems: 1, blockBytes: 4},
	27: {name: "I64", blockElems: 1, blockBytes: 8},
	28: {name: "F64", blockElems: 1, blockBytes: 8},
	29: {name: "IQ1_M", blockElems: 256, blockBytes: 56},
	30: {"BF16", 1, 2, kernels.BF16, true},
	34: {name: "TQ1_0", blockElems: 256, blockBytes: 54},
	35: {name: "TQ2_0", blockElems: 256, blockBytes: 66},
	39: {name: "MXFP4", blockElems: 32, blockBytes: 17},
	40: {name: "NVFP4", blockElems: 64, blockBytes: 36},
	41: {name: "Q1_0", blockElems: 128, blockBytes: 18},
	42: {name: "Q2_0", blockElems: 64, blockBytes: 18},
}

func (t GGMLType) info() (typeInfo, bool) {
	ti, ok := ggmlTypes[t]
	return ti, ok
}

// String is ggml's name of the type ("Q4_K", "BF16", ...).
func (t GGMLType) String() string {
	if ti, ok := ggmlTypes[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// DType is the kernels' dtype for t; ok is false for types the kernels do
// not compute with (Q4_1, Q2_K, the IQ types, ...).
func (t GGMLType) DType() (kernels.DType, bool) {
	ti, ok := ggmlTypes[t]
	return ti.kd, ok && ti.kernel
}

// supportedTypes is what errors list as usable.
const supportedTypes = "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K"

// fileTypes names general.file_type (llama_ftype), the quantization a file
// was made with, as llama.cpp's tools spell it.
var fileTypes = map[uint64]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
	10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
	16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
	22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
	28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
	38: "MXFP4",
}
