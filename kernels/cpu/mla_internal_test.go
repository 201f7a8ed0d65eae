package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
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

// TestTopKHeap checks the heap selection against a full sort, with many
// ties and −∞ columns.
func TestTopKHeap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(60)
		k := 1 + rng.IntN(n+3)
		scores := make([]float32, n)
		for i := range scores {
			scores[i] = float32(rng.IntN(7)) - 3 // few distinct values: ties are common
			if trial%2 == 0 {
				scores[i] = float32(rng.NormFloat64())
			}
			if trial%3 == 0 && rng.IntN(4) == 0 {
				scores[i] = float32(math.Inf(-1))
			}
		}
		want := make([]int32, k)
		ref.SelectTopK(want, scores)
		got := make([]int32, k)
		for j := topK(scores, make([]int32, 0, k), got); j < k; j++ {
			got[j] = -1
		}
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: top-%d of %v = %v, want %v", trial, k, scores, got, want)
		}
	}
}

func TestNaiveCheaper(t *testing.T) {
	dsv3 := kernels.MLAShape{KVLora: 512, Nope: 128, Rope: 64, V: 128}
	tiny := kernels.MLAShape{KVLora: 32, Nope: 16, Rope: 8, V: 16}
	for _, tc := range []struct {
		s            kernels.MLAShape
		n, ctx, topK int
		naive        bool
		comment      string
	}{
		{dsv3, 2048, 2048, 0, true, "prefill"},
		{dsv3, 512, 8192, 0, true, "prefill chunk over a cached context"},
		{dsv3, 1, 4096, 0, false, "decode"},
		{dsv3, 4, 4096, 0, false, "verification"},
		{tiny, 83, 83, 0, true, "fixture prompt"},
		{tiny, 1, 84, 0, false, "fixture decode"},
		{dsv3, 2048, 100000, 2048, false, "DSA chunk over a long context"},
		{dsv3, 2048, 2048, 2048, true, "DSA prefill"},
	} {
		if got := naiveCheaper(tc.s, tc.n, tc.ctx, tc.topK); got != tc.naive {
			t.Errorf("%s (n %d, ctx %d): naive %v, want %v", tc.comment, tc.n, tc.ctx, got, tc.naive)
		}
	}
}
