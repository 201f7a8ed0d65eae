package nn

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// missing is a checkpoint without any tensor.
type missing struct{}

var errMissing = errors.New("no such tensor")

func (missing) Has(string) bool                                    { return false }
func (missing) Mat(string, int, int) (*kernels.Mat, error)         { return nil, errMissing }
func (missing) Expert(string, int, int, int) (*kernels.Mat, error) { return nil, errMissing }
func (missing) Float32(string, ...int) ([]float32, error)          { return nil, errMissing }

// The placeholders of failed loads are sized by config.json, which may be
// damaged: they stay within maxPlaceholders floats in all, so thousands of
// missing layers of a huge width cannot exhaust memory.
func TestLoaderPlaceholders(t *testing.T) {
	l := NewLoader(missing{})
	if v := l.Vec("small", 7); len(v) != 7 {
		t.Errorf("small placeholder of %d floats, want 7", len(v))
	}
	if v := l.Tensor("huge", 1<<40, 1<<40, 3); v != nil {
		t.Errorf("huge placeholder of %d floats", len(v))
	}
	if v := l.Tensor("negative", 4, -1); v != nil {
		t.Errorf("negative shape: %d floats", len(v))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 6000 {
		l.Vec("layer.norm", 1<<16)
		l.Tensor("layer.conv", 1<<16, 1, 4)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 4*maxPlaceholders+(8<<20) {
		t.Errorf("placeholders allocated %d MiB", n>>20)
	}
	if l.Err() == nil || !strings.Contains(l.Err().Error(), "and 11995 more load errors") {
		t.Errorf("error %v", l.Err())
	}
}

// After failFast failures the Loader stops looking tensors up, so a damaged
// layer count times an expert count of thousands costs little time.
func TestLoaderFailsFast(t *testing.T) {
	w := &counting{}
	l := NewLoader(w)
	start := time.Now()
	for range 1 << 22 {
		l.Expert("layer.expert", 0, 4, 4)
	}
	if w.calls != failFast {
		t.Errorf("%d lookups, want %d", w.calls, failFast)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// counting is a checkpoint without any tensor that counts lookups.
type counting struct {
	missing
	calls int
}

func (c *counting) Expert(string, int, int, int) (*kernels.Mat, error) {
	c.calls++
	return nil, errMissing
}
