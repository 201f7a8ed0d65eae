package weights

// MapFile memory-maps the whole of path read-only (on systems without mmap
// it reads the file into memory) for other readers of weight files, such as
// package gguf. unmap releases the mapping; data must not be used after it.
func MapFile(path string) (data []byte, unmap func() error, err error) {
	m, err := mapFile(path)
	if err != nil {
		return nil, nil, err
	}
	return m.data, m.close, nil
}
