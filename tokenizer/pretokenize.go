package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// piece is one part of the input on its way to the model.
type piece struct {
	s  string
	id int32 // an added token's id, or -1
	// mapped: s holds raw bytes whose ByteLevel mapping is the real piece
	// text; the mapping is done lazily (the BPE model reads bytes directly).
	mapped bool
	// atStart: the piece begins at the start of the original input.
	atStart bool
}

// text returns the piece's real text, materializing a lazy byte mapping.
func (p piece) text() string {
	if p.mapped {
		return byteLevelString(p.s)
	}
	return p.s
}

type preTokenizer interface {
	split(p piece, out []piece) []piece
}

type ptSeq []preTokenizer

func (s ptSeq) split(p piece, out []piece) []piece {
	if len(s) == 0 {
		return append(out, p)
	}
	cur := s[0].split(p, nil)
	for _, pt := range s[1:] {
		if bl, ok := pt.(ptByteLevel); ok && !bl.useRegex && !bl.addPrefixSpace {
			// Only marks the pieces for byte-level mapping.
			for i := range cur {
				if cur[i].mapped {
					cur[i].s = byteLevelString(cur[i].s)
				}
				cur[i].mapped = true
			}
			continue
		}
		var next []piece
		for _, c := range cur {
			next = pt.split(c, next)
		}
		cur = next
	}
	return append(out, cur...)
}

// splitPiece cuts p with a pattern and behavior, dropping empty pieces.
func splitPiece(p piece, pat pattern, b splitBehavior, out []piece) []piece {
	s := p.text()
	sp := splitSpans(pat.findMatches(s, nil), b)
	for _, x := range sp {
		if x.end > x.start {
			out = append(out, piece{s: s[x.start:x.end], id: -1, atStart: p.atStart && x.start == 0})
		}
	}
	return out
}

type ptSplit struct {
	pat pattern
	b   splitBehavior
}

func (t ptSplit) split(p piece, out []piece) []piece { return splitPiece(p, t.pat, t.b, out) }

type ptByteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (t ptByteLevel) split(p piece, out []piece) []piece {
	s := p.text()
	if t.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !t.useRegex {
		return append(out, piece{s: s, id: -1, mapped: true, atStart: p.atStart})
	}
	k := len(out)
	out = splitPiece(piece{s: s, id: -1, atStart: p.atStart}, gpt2Matcher{}, splitIsolated, out)
	for i := k; i < len(out); i++ {
		out[i].mapped = true
	}
	return out
}

type ptMetaspace struct {
	rep     string
	prepend string // "always", "first", "never"
	doSplit bool
}

func (t ptMetaspace) split(p piece, out []piece) []piece {
	s := strings.ReplaceAll(p.text(), " ", t.rep)
	switch t.prepend {
	case "always":
		if !strings.HasPrefix(s, t.rep) {
			s = t.rep + s
		}
	case "first":
		if !strings.HasPrefix(s, t.rep) && p.atStart {
			s = t.rep + s
		}
	}
	q := piece{s: s, id: -1, atStart: p.atStart}
	if !t.doSplit {
		return append(out, q)
	}
	r, _ := utf8.DecodeRuneInString(t.rep)
	return splitPiece(q, runePattern{func(c rune) bool { return c == r }}, splitMergedWithNext, out)
}

// wordPattern is `\w+|[^\w\s]+` (the Whitespace pre-tokenizer).
type wordPattern struct{}

func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Other_Alphabetic, r) || r == 0x200C || r == 0x200D
}

func (wordPattern) findMatches(s string, dst []span) []span {
	if s == "" {
		return append(dst, span{0, 0, false})
	}
	prev := 0
	for i := 0; i < len(s); {
		r, n := runeAt(s, i)
		var e int
		switch {
		case isWordRune(r):
			e = classRun(s, i+n, isWordRune)
		case !isSpace(r):
			e = classRun(s, i+n, func(c rune) bool { return !isWordRune(c) && !isSpace(c) })
		default:
			i += n
			continue
		}
		if prev != i {
			dst = append(dst, span{prev, i, false})
		}
		dst = append(dst, span{i, e, true})
		prev, i = e, e
	}
	if prev != len(s) {
		dst = append(dst, span{prev, len(s), false})
	}
	return dst
}

func isPunc(r rune) bool {
	return r < utf8.RuneSelf && unicode.IsPunct(r) || r < utf8.RuneSelf && strings.ContainsRune("$+<=>^`|~", r) || unicode.IsPunct(r)
}

type ptConfig struct {
	Type             string            `json:"type"`
	Pretokenizers    []json.RawMessage `json:"pretokenizers"`
	Pattern          patternConfig     `json:"pattern"`
	Behavior         string            `json:"behavior"`
	Invert           bool              `json:"invert"`
	AddPrefixSpace   *bool             `json:"add_prefix_space"`
	UseRegex         *bool             `json:"use_regex"`
	IndividualDigits bool              `json:"individual_digits"`
	Replacement      string            `json:"replacement"`
	PrependScheme    string            `json:"prepend_scheme"`
	Split            *bool             `json:"split"`
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c ptConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return parseSeq[ptSeq]("pretokenizers", c.Pretokenizers, parsePreTokenizer)
	case "Split":
		pat, err := c.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		if c.Invert {
			pat = invertPattern{pat}
		}
		return ptSplit{pat, b}, nil
	case "ByteLevel":
		return ptByteLevel{
			addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace,
			useRegex:       c.UseRegex == nil || *c.UseRegex,
		}, nil
	case "Digits":
		b := splitContiguous
		if c.IndividualDigits {
			b = splitIsolated
		}
		return ptSplit{runePattern{unicode.IsNumber}, b}, nil
	case "Metaspace":
		rep := c.Replacement
		if utf8.RuneCountInString(rep) != 1 {
			return nil, fmt.Errorf("Metaspace: replacement must be one character, got %q", rep)
		}
		scheme := c.PrependScheme
		if scheme == "" {
			scheme = "always"
		}
		if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			scheme = "never"
		}
		if scheme != "always" && scheme != "first" && scheme != "never" {
			return nil, fmt.Errorf("Metaspace: unknown prepend_scheme %q", scheme)
		}
		return ptMetaspace{rep: rep, prepend: scheme, doSplit: c.Split == nil || *c.Split}, nil
	case "Whitespace":
		return ptSplit{invertPattern{wordPattern{}}, splitRemoved}, nil
	case "WhitespaceSplit":
		return ptSplit{runePattern{unicode.IsSpace}, splitRemoved}, nil
	case "Punctuation":
		b := splitIsolated
		if c.Behavior != "" {
			var err error
			if b, err = parseBehavior(c.Behavior); err != nil {
				return nil, fmt.Errorf("Punctuation: %w", err)
			}
		}
		return ptSplit{runePattern{isPunc}, b}, nil
	case "BertPreTokenizer":
		return ptSeq{ptSplit{runePattern{unicode.IsSpace}, splitRemoved}, ptSplit{runePattern{isPunc}, splitIsolated}}, nil
	case "":
		return nil, fmt.Errorf("pre-tokenizer without a type")
	}
	return nil, fmt.Errorf("unsupported pre-tokenizer type %q", c.Type)
}
