//go:build !(linux && (amd64 || arm64))

package device

import "errors"

func openCUDA(int, int) (*Backend, error) {
	return nil, errors.New("cuda: GPUs are supported on linux/amd64 and linux/arm64 only")
}
