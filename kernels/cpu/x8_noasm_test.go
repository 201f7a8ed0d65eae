//go:build !amd64 || noasm

package cpu

import "github.com/ferrite-llm/ferrite/kernels"

// moreX8Sets returns nil: this build has no x8 assembly.
func moreX8Sets(kernels.DType) map[string]*x8Set { return nil }
