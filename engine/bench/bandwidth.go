package bench

import (
	"bytes"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Bandwidth is a memory read-bandwidth measurement.
type Bandwidth struct {
	BytesPerSec float64 // the best round
	BufferBytes int64
	Rounds      int
	Threads     int // the backend's threads (0 if unknown)
}

// streamChunk is the unit of work of one Parallel index.
const streamChunk = 1 << 20

// MeasureBandwidth fills a buffer of size bytes (rounded up to 1 MiB; make
// it much larger than the last-level cache) and reads it end to end rounds
// times with be.Parallel, 1 MiB per task, returning the fastest round. The
// read is bytes.IndexByte looking for a byte the buffer does not hold: the
// Go runtime's vector loop, loads and compares only, no stores, so it runs
// at memory speed where a scalar Go loop would not.
func MeasureBandwidth(be kernels.Backend, size int64, rounds int) Bandwidth {
	n := max(1, int((size+streamChunk-1)/streamChunk))
	rounds = max(rounds, 1)
	buf := make([]byte, n*streamChunk)
	be.Parallel(n, func(lo, hi int) { // touch every page, from the workers
		part := buf[lo*streamChunk : hi*streamChunk]
		for i := range part {
			part[i] = byte(i%251) | 1 // never 0
		}
	})
	found := make([]int, n)
	bw := Bandwidth{BufferBytes: int64(len(buf)), Rounds: rounds}
	if t, ok := be.(interface{ Threads() int }); ok {
		bw.Threads = t.Threads()
	}
	for range rounds {
		start := time.Now()
		be.Parallel(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				found[i] = bytes.IndexByte(buf[i*streamChunk:(i+1)*streamChunk], 0)
			}
		})
		if d := time.Since(start).Seconds(); d > 0 {
			bw.BytesPerSec = max(bw.BytesPerSec, float64(len(buf))/d)
		}
	}
	for _, f := range found {
		if f >= 0 {
			panic("bench: stream buffer holds a zero byte")
		}
	}
	return bw
}
