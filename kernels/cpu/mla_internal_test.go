package cpu

import (
	"fmt"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestMLANaiveTiles runs the op conformance suite with the naive MLA form
// expanding 1, 3 and 7 keys at a time, so the online softmax crosses tile
// boundaries inside blocks and selections.
func TestMLANaiveTiles(t *testing.T) {
	for _, tile := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(tile), func(t *testing.T) {
			b := New(2)
			defer b.Close()
			b.mlaTile = tile
			kerneltest.RunOps(t, b)
		})
	}
}
