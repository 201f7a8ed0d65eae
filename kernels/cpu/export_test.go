package cpu

// ForceGenericBF16 sends BF16 weights through the bf16 path with its pure-Go
// tiles, on any CPU, until restore is called.
func ForceGenericBF16() (restore func()) {
	old := forceGenericBF16.Swap(true)
	return func() { forceGenericBF16.Store(old) }
}

// ForceGenericX8 sends Q8_0 and Q4_0 weights through the x8 path (x8.go)
// with its pure-Go kernels, on any CPU, until restore is called.
func ForceGenericX8() (restore func()) {
	old := forceGenericX8.Swap(true)
	return func() { forceGenericX8.Store(old) }
}
