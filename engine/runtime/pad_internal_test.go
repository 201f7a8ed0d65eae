package runtime

import "testing"

// TestPadBucket checks the batch buckets: 1, 2, 4, 8, 16, 32, 48, 64,
// then multiples of 32, each the smallest at least n.
func TestPadBucket(t *testing.T) {
	buckets := []int{1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160}
	for n := 1; n <= 160; n++ {
		want := 0
		for _, b := range buckets {
			if b >= n {
				want = b
				break
			}
		}
		if got := padBucket(n); got != want {
			t.Errorf("padBucket(%d) = %d, want %d", n, got, want)
		}
	}
}
