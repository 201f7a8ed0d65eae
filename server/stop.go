package server

import "strings"

// stopper finds the request's stop strings in streamed text. Text that
// could be the start of a stop string is held back until the next piece
// shows whether it is one, so a stop string split over several tokens
// never reaches the client, not even in part.
type stopper struct {
	stops []string // non-empty strings
	held  string   // text not yet released: a proper prefix of some stop string
}

// add takes the next piece of text and returns what can be released, and
// whether a stop string ended the text (out is then everything before the
// first stop string, and the rest is dropped).
func (s *stopper) add(text string) (out string, hit bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	buf := s.held + text
	first := -1
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		s.held = ""
		return buf[:first], true
	}
	k := partialSuffix(buf, s.stops)
	s.held = buf[len(buf)-k:]
	return buf[:len(buf)-k], false
}

// flush releases the text held back (the generation ended without it
// becoming a stop string).
func (s *stopper) flush() string {
	h := s.held
	s.held = ""
	return h
}

// partialSuffix is the length of the longest suffix of buf that is a
// proper prefix of one of pats. Such a suffix starts where a pattern does,
// at a character boundary, so cutting it off leaves valid UTF-8.
func partialSuffix(buf string, pats []string) int {
	best := 0
	for _, p := range pats {
		for l := min(len(p)-1, len(buf)); l > best; l-- {
			if strings.HasSuffix(buf, p[:l]) {
				best = l
				break
			}
		}
	}
	return best
}
