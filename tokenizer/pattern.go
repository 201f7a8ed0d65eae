package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// span is one piece of a string cut by a pattern: [start,end) in bytes, and
// whether the pattern matched it.
type span struct {
	start, end int
	match      bool
}

// pattern finds the matches of a split or replace pattern, as the Rust
// tokenizers Pattern trait does: the result covers the whole input with
// alternating matched and unmatched spans. An empty input gives one empty
// unmatched span.
type pattern interface {
	findMatches(s string, dst []span) []span
}

// Well-known pre-tokenizer regexes. They use a lookahead, which Go's regexp
// lacks, so each has a hand-written matcher that is exact and fast.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// The well-known regexes, for tokenizers built from lists (NewBPE's
// Splits): GPT-2's, Llama 3's (also GLM-4's) and Qwen2's (also Qwen3's).
const (
	GPT2Regex   = gpt2Pattern
	Llama3Regex = llama3Pattern
	Qwen2Regex  = qwen2Pattern
)

// compileRegex returns a pattern for an Oniguruma regex from tokenizer.json.
func compileRegex(re string) (pattern, error) {
	switch re {
	case gpt2Pattern:
		return gpt2Matcher{}, nil
	case llama3Pattern:
		return llama3Matcher{maxDigits: 3}, nil
	case qwen2Pattern:
		return llama3Matcher{maxDigits: 1}, nil
	}
	r, err := regexp2.Compile(re, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", re, err)
	}
	return &regexPattern{re: r}, nil
}

// Character classes as Oniguruma sees them for UTF-8 text: \s is Unicode
// White_Space, \p{L} and \p{N} the general categories.
// ASCII classes, looked up in a table.
const (
	clsSpace = 1 << iota
	clsLetter
	clsNumber
)

var asciiClass = func() (t [128]uint8) {
	for r := rune(0); r < 128; r++ {
		switch {
		case unicode.IsSpace(r):
			t[r] = clsSpace
		case unicode.IsLetter(r):
			t[r] = clsLetter
		case unicode.IsNumber(r):
			t[r] = clsNumber
		}
	}
	return
}()

func isSpace(r rune) bool {
	if uint32(r) < 128 {
		return asciiClass[r] == clsSpace
	}
	return unicode.IsSpace(r)
}

func isLetter(r rune) bool {
	if uint32(r) < 128 {
		return asciiClass[r] == clsLetter
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if uint32(r) < 128 {
		return asciiClass[r] == clsNumber
	}
	return unicode.IsNumber(r)
}

func isOther(r rune) bool {
	if uint32(r) < 128 {
		return asciiClass[r] == 0
	}
	return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	c := s[i]
	if c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// runMatches is the find_iter loop shared by the hand-written matchers: next
// returns the end of the match starting at i (every position matches).
func runMatches(s string, dst []span, next func(s string, i int) int) []span {
	if s == "" {
		return append(dst, span{0, 0, false})
	}
	for i := 0; i < len(s); {
		e := next(s, i)
		dst = append(dst, span{i, e, true})
		i = e
	}
	return dst
}

// contraction returns the length of 's 't 're 've 'm 'll 'd at s[i:] (which
// starts with an apostrophe), or 0. Onig's (?i) here folds ASCII only: 'ſ
// (long s) does not match, as the fixtures show.
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return 0
	}
	c1 := s[i+1]
	if fold && c1 >= 'A' && c1 <= 'Z' {
		c1 += 'a' - 'A'
	}
	switch c1 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if i+2 >= len(s) {
			return 0
		}
		c2 := s[i+2]
		if fold && c2 >= 'A' && c2 <= 'Z' {
			c2 += 'a' - 'A'
		}
		if (c1 == 'r' || c1 == 'v') && c2 == 'e' || c1 == 'l' && c2 == 'l' {
			return 3
		}
	}
	return 0
}

// spaceRun returns the end of the run of whitespace starting at i.
func spaceRun(s string, i int) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !isSpace(r) {
			break
		}
		i += n
	}
	return i
}

// classRun returns the end of the run of runes in class starting at i.
func classRun(s string, i int, class func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !class(r) {
			break
		}
		i += n
	}
	return i
}

// trailingSpaces implements `\s+(?!\S)|\s+` at i (s[i] is whitespace).
func trailingSpaces(s string, i int) int {
	j := spaceRun(s, i)
	if j == len(s) {
		return j
	}
	// Give back the last whitespace rune so that it joins the next word,
	// unless the run is a single rune.
	_, n := utf8.DecodeLastRuneInString(s[:j])
	if j-n > i {
		return j - n
	}
	return j
}

// gpt2Matcher matches gpt2Pattern.
type gpt2Matcher struct{}

func (gpt2Matcher) findMatches(s string, dst []span) []span {
	return runMatches(s, dst, gpt2Next)
}

func gpt2Next(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if k := contraction(s, i, false); k > 0 {
			return i + k
		}
	}
	j := i
	c := r
	if r == ' ' {
		c2, n2 := runeAt(s, i+n)
		if c2 >= 0 && !isSpace(c2) {
			j, c, n = i+n, c2, n2
		}
	}
	switch {
	case isLetter(c):
		return classRun(s, j+n, isLetter)
	case isNumber(c):
		return classRun(s, j+n, isNumber)
	case !isSpace(c):
		return classRun(s, j+n, isOther)
	}
	return trailingSpaces(s, i)
}

// llama3Matcher matches llama3Pattern (maxDigits 3) and qwen2Pattern
// (maxDigits 1).
type llama3Matcher struct{ maxDigits int }

func (m llama3Matcher) findMatches(s string, dst []span) []span {
	return runMatches(s, dst, m.next)
}

func (m llama3Matcher) next(s string, i int) int {
	r, n := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if k := contraction(s, i, true); k > 0 {
			return i + k
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return classRun(s, i+n, isLetter)
	}
	r2, n2 := runeAt(s, i+n)
	if r != '\r' && r != '\n' && !isNumber(r) && r2 >= 0 && isLetter(r2) {
		return classRun(s, i+n+n2, isLetter)
	}
	// \p{N}{1,m}
	if isNumber(r) {
		j := i + n
		for k := 1; k < m.maxDigits; k++ {
			c, cn := runeAt(s, j)
			if c < 0 || !isNumber(c) {
				break
			}
			j += cn
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := -1
	if isOther(r) {
		j = i
	} else if r == ' ' && r2 >= 0 && isOther(r2) {
		j = i + n
	}
	if j >= 0 {
		j = classRun(s, j, isOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// r is whitespace here.
	// \s*[\r\n]+ : the match ends after the last CR/LF of the whitespace run.
	e := spaceRun(s, i)
	for k := e - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	// \s+(?!\S)|\s+
	return trailingSpaces(s, i)
}

// regexPattern is the general fallback for any other regex: regexp2 has
// lookarounds and .NET-style Unicode classes (\s = White_Space as in Onig).
type regexPattern struct{ re *regexp2.Regexp }

func (p *regexPattern) findMatches(s string, dst []span) []span {
	if s == "" {
		return append(dst, span{0, 0, false})
	}
	runes := []rune(s)
	// byte offset of each rune index
	offs := make([]int, len(runes)+1)
	o := 0
	for i, r := range runes {
		offs[i] = o
		o += utf8.RuneLen(r)
	}
	offs[len(runes)] = o
	prev := 0
	lastEnd := -1
	m, err := p.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		st, en := offs[m.Index], offs[m.Index+m.Length]
		// Like onig's find_iter, skip an empty match right after the
		// previous match.
		if !(st == en && en == lastEnd) {
			if prev != st {
				dst = append(dst, span{prev, st, false})
			}
			dst = append(dst, span{st, en, true})
			prev = en
			lastEnd = en
		}
		m, err = p.re.FindNextMatch(m)
	}
	if prev != len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

// literalPattern matches a fixed string (Split/Replace with a String pattern).
type literalPattern struct{ lit string }

func (p literalPattern) findMatches(s string, dst []span) []span {
	if s == "" {
		return append(dst, span{0, 0, false})
	}
	prev := 0
	for i := 0; i <= len(s); {
		k := strings.Index(s[i:], p.lit)
		if k < 0 {
			break
		}
		st := i + k
		en := st + len(p.lit)
		if prev != st {
			dst = append(dst, span{prev, st, false})
		}
		dst = append(dst, span{st, en, true})
		prev = en
		i = en
	}
	if prev != len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

// runePattern matches every single rune for which f is true, each rune its
// own match (the Rust Fn(char) -> bool pattern).
type runePattern struct{ f func(rune) bool }

func (p runePattern) findMatches(s string, dst []span) []span {
	if s == "" {
		return append(dst, span{0, 0, false})
	}
	last := 0
	for i, r := range s {
		if p.f(r) {
			if last < i {
				dst = append(dst, span{last, i, false})
			}
			n := utf8.RuneLen(r)
			if r == utf8.RuneError {
				_, n = utf8.DecodeRuneInString(s[i:])
			}
			dst = append(dst, span{i, i + n, true})
			last = i + n
		}
	}
	if last < len(s) {
		dst = append(dst, span{last, len(s), false})
	}
	return dst
}

// invertPattern flips matched and unmatched spans.
type invertPattern struct{ p pattern }

func (p invertPattern) findMatches(s string, dst []span) []span {
	k := len(dst)
	dst = p.p.findMatches(s, dst)
	for i := k; i < len(dst); i++ {
		dst[i].match = !dst[i].match
	}
	return dst
}

// splitBehavior is SplitDelimiterBehavior.
type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return splitRemoved, nil
	case "Isolated":
		return splitIsolated, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// splitSpans applies a behavior to the spans of a pattern and returns the
// pieces to keep (NormalizedString::split). Empty pieces are kept here; the
// caller drops them.
func splitSpans(sp []span, b splitBehavior) []span {
	switch b {
	case splitIsolated:
		return sp
	case splitRemoved:
		out := sp[:0]
		for _, x := range sp {
			if !x.match {
				out = append(out, x)
			}
		}
		return out
	case splitContiguous:
		out := make([]span, 0, len(sp))
		prevMatch := false
		for _, x := range sp {
			if x.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = x.end
			} else {
				out = append(out, span{x.start, x.end, false})
			}
			prevMatch = x.match
		}
		return out
	case splitMergedWithPrevious:
		out := make([]span, 0, len(sp))
		prevMatch := false
		for _, x := range sp {
			if x.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = x.end
			} else {
				out = append(out, span{x.start, x.end, false})
			}
			prevMatch = x.match
		}
		return out
	case splitMergedWithNext:
		out := make([]span, 0, len(sp))
		prevMatch := false
		for i := len(sp) - 1; i >= 0; i-- {
			x := sp[i]
			if x.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = x.start
			} else {
				out = append(out, span{x.start, x.end, false})
			}
			prevMatch = x.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	return sp
}
