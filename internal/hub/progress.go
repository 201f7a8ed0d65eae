package hub

import (
	"fmt"
	"time"

	"github.com/ferrite-llm/ferrite/internal/units"
)

// Progress is a pull's state, reported to Pull's callback.
type Progress struct {
	Repo  string // "ORG/NAME"
	Stage string // "listing files", "downloading", "waiting for another pull", "done"…
	// File is the file that progressed last (several download at once);
	// "" before the downloads and when done.
	File     string
	Index    int   // File's 1-based number among Files
	FileDone int64 // File's bytes present
	Files    int   // files the pull fetches (cached ones included)
	Done     int64 // bytes present so far, cached and resumed ones included
	Total    int64 // bytes of every file the pull fetches; 0 before the listing
	Speed    float64
	// ETA is the time left at Speed; negative when unknown.
	ETA time.Duration
}

// Fraction is Done/Total, in [0, 1].
func (p Progress) Fraction() float64 {
	if p.Total <= 0 {
		return 0
	}
	return min(float64(p.Done)/float64(p.Total), 1)
}

// String is a one-line summary: "1.2 GiB / 3.4 GiB (35%) · 41.0 MiB/s · ETA 55s".
func (p Progress) String() string {
	if p.Total <= 0 {
		return p.Stage
	}
	s := fmt.Sprintf("%s / %s (%.0f%%)", units.Bytes(p.Done), units.Bytes(p.Total), 100*p.Fraction())
	if r := p.Rate(); r != "" {
		s += " · " + r
	}
	return s
}

// Rate is the speed and the time left, "41.0 MiB/s · ETA 55s"; "" before
// the speed is known.
func (p Progress) Rate() string {
	if p.Speed <= 0 {
		return ""
	}
	s := units.Bytes(int64(p.Speed)) + "/s"
	if p.ETA >= 0 && p.Done < p.Total {
		s += " · ETA " + units.Duration(p.ETA)
	}
	return s
}

// speedWindow is the span over which the speed is measured.
const speedWindow = 5 * time.Second

// meter measures a transfer's speed over the last speedWindow: a ring of
// (time, bytes transferred) samples.
type meter struct {
	t     []time.Time
	bytes []int64
	total int64 // bytes transferred (not counting cached or resumed ones)
}

// add records n more bytes at now.
func (m *meter) add(now time.Time, n int64) {
	m.total += n
	m.t = append(m.t, now)
	m.bytes = append(m.bytes, m.total)
	// Keep one sample older than the window, so the window is full.
	drop := 0
	for drop+1 < len(m.t) && now.Sub(m.t[drop+1]) >= speedWindow {
		drop++
	}
	if drop > 0 {
		m.t = append(m.t[:0], m.t[drop:]...)
		m.bytes = append(m.bytes[:0], m.bytes[drop:]...)
	}
}

// speed is bytes per second over the window; 0 until two samples are
// apart in time.
func (m *meter) speed() float64 {
	if len(m.t) < 2 {
		return 0
	}
	dt := m.t[len(m.t)-1].Sub(m.t[0]).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(m.bytes[len(m.bytes)-1]-m.bytes[0]) / dt
}
