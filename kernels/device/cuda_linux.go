//go:build linux && (amd64 || arm64)

package device

import "github.com/ferrite-llm/ferrite/kernels/cuda"

func openCUDA(ordinal, threads int) (*Backend, error) {
	b, err := cuda.OpenBackend(ordinal, threads)
	if err != nil {
		return nil, err
	}
	return &Backend{Backend: b, Desc: b.Device().String(), close: b.Close}, nil
}
