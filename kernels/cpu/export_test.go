package cpu

// ForceGenericBF16 sends BF16 weights through the bf16 path with its pure-Go
// tiles, on any CPU, until restore is called.
func ForceGenericBF16() (restore func()) {
	old := forceGenericBF16.Swap(true)
	return func() { forceGenericBF16.Store(old) }
}
