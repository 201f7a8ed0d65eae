package server

import (
	"strings"
	"testing"
)

// feed runs pieces through a stopper and returns the released text and
// whether a stop string was hit.
func feed(stops []string, pieces ...string) (string, bool) {
	s := stopper{stops: stops}
	var out strings.Builder
	for _, p := range pieces {
		o, hit := s.add(p)
		out.WriteString(o)
		if hit {
			return out.String(), true
		}
	}
	out.WriteString(s.flush())
	return out.String(), false
}

func TestStopperHoldsBackAcrossPieces(t *testing.T) {
	cases := []struct {
		name   string
		stops  []string
		pieces []string
		want   string
		hit    bool
	}{
		{"none", nil, []string{"a", "b"}, "ab", false},
		{"whole piece", []string{"END"}, []string{"abc", "END", "x"}, "abc", true},
		{"split over three", []string{"END"}, []string{"abE", "N", "Dxyz"}, "ab", true},
		{"false start released", []string{"END"}, []string{"abE", "Nx", "y"}, "abENxy", false},
		{"prefix held to the end", []string{"END"}, []string{"abEN"}, "abEN", false},
		{"inside one piece", []string{"\n\n"}, []string{"one\n\ntwo"}, "one", true},
		{"earliest of several", []string{"cd", "bc"}, []string{"ab", "cd"}, "a", true},
		{"overlapping prefix", []string{"aab"}, []string{"a", "a", "a", "b"}, "a", true},
		{"multi-byte", []string{"é!"}, []string{"caf", "é", "!"}, "caf", true},
		{"at the start", []string{"x"}, []string{"xyz"}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, hit := feed(c.stops, c.pieces...)
			if got != c.want || hit != c.hit {
				t.Errorf("got %q, hit %v; want %q, hit %v", got, hit, c.want, c.hit)
			}
		})
	}
}

// TestStopperNeverLeaksAPrefix checks, for every way of cutting a text into
// pieces, that no released text ever contains the start of the stop string
// that ends the text.
func TestStopperNeverLeaksAPrefix(t *testing.T) {
	const text = "The answer is here.\nUser: next"
	stop := "\nUser:"
	for cut1 := 1; cut1 < len(text); cut1++ {
		for cut2 := cut1 + 1; cut2 < len(text); cut2++ {
			got, hit := feed([]string{stop}, text[:cut1], text[cut1:cut2], text[cut2:])
			if !hit || got != "The answer is here." {
				t.Fatalf("cuts %d,%d: got %q, hit %v", cut1, cut2, got, hit)
			}
		}
	}
}

func TestPartialSuffix(t *testing.T) {
	for _, c := range []struct {
		buf  string
		pats []string
		want int
	}{
		{"abc", []string{"cde"}, 1},
		{"abcd", []string{"cde", "bcdx"}, 3},
		{"abc", []string{"abc"}, 0}, // a whole match is not a proper prefix
		{"", []string{"abc"}, 0},
		{"xyz", []string{"abc"}, 0},
	} {
		if got := partialSuffix(c.buf, c.pats); got != c.want {
			t.Errorf("partialSuffix(%q, %q) = %d, want %d", c.buf, c.pats, got, c.want)
		}
	}
}
