package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites the text between added tokens before pre-tokenization.
// atStart reports whether the text still begins at the start of the original
// input (Metaspace's prepend_scheme "first" needs it); normalizers that drop
// leading text clear it.
type normalizer interface {
	normalize(s string, atStart bool) (string, bool)
}

type normSeq []normalizer

func (n normSeq) normalize(s string, atStart bool) (string, bool) {
	for _, x := range n {
		s, atStart = x.normalize(s, atStart)
	}
	return s, atStart
}

type normForm struct{ f norm.Form }

func (n normForm) normalize(s string, atStart bool) (string, bool) {
	return n.f.String(s), atStart
}

type normLowercase struct{}

func (normLowercase) normalize(s string, atStart bool) (string, bool) {
	// Rust's char::to_lowercase, one char at a time (no final-sigma rule).
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == '\u0130' { // the one unconditional multi-char lowercase mapping
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String(), atStart
}

type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string, atStart bool) (string, bool) {
	if n.left {
		t := strings.TrimLeftFunc(s, unicode.IsSpace)
		if len(t) != len(s) {
			atStart = false
		}
		s = t
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s, atStart
}

type normStripAccents struct{}

func (normStripAccents) normalize(s string, atStart bool) (string, bool) {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.M, r) {
			return -1
		}
		return r
	}, s), atStart
}

type normPrepend struct{ p string }

func (n normPrepend) normalize(s string, atStart bool) (string, bool) {
	if s == "" {
		return s, atStart
	}
	return n.p + s, atStart
}

type normReplace struct {
	pat     pattern
	content string
}

func (n normReplace) normalize(s string, atStart bool) (string, bool) {
	return replaceAll(n.pat, s, n.content), atStart
}

func replaceAll(p pattern, s, content string) string {
	sp := p.findMatches(s, nil)
	any := false
	for _, x := range sp {
		if x.match {
			any = true
			break
		}
	}
	if !any {
		return s
	}
	var b strings.Builder
	for _, x := range sp {
		if x.match {
			b.WriteString(content)
		} else {
			b.WriteString(s[x.start:x.end])
		}
	}
	return b.String()
}

// normByteLevel is the ByteLevel normalizer: every byte becomes its
// byte-level character.
type normByteLevel struct{}

func (normByteLevel) normalize(s string, atStart bool) (string, bool) {
	return byteLevelString(s), atStart
}

type normConfig struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	StripLeft   *bool             `json:"strip_left"`
	StripRight  *bool             `json:"strip_right"`
	Prepend     string            `json:"prepend"`
	Pattern     patternConfig     `json:"pattern"`
	Content     string            `json:"content"`
}

// patternConfig is {"String": "..."} or {"Regex": "..."}.
type patternConfig struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p patternConfig) compile() (pattern, error) {
	switch {
	case p.String != nil:
		if *p.String == "" {
			return nil, fmt.Errorf("empty String pattern")
		}
		return literalPattern{*p.String}, nil
	case p.Regex != nil:
		return compileRegex(*p.Regex)
	}
	return nil, fmt.Errorf("pattern needs String or Regex")
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c normConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return parseSeq[normSeq]("normalizers", c.Normalizers, parseNormalizer)
	case "NFC":
		return normForm{norm.NFC}, nil
	case "NFD":
		return normForm{norm.NFD}, nil
	case "NFKC":
		return normForm{norm.NFKC}, nil
	case "NFKD":
		return normForm{norm.NFKD}, nil
	case "Lowercase":
		return normLowercase{}, nil
	case "Strip":
		return normStrip{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, nil
	case "StripAccents":
		return normStripAccents{}, nil
	case "Prepend":
		return normPrepend{c.Prepend}, nil
	case "Replace":
		p, err := c.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		return normReplace{p, c.Content}, nil
	case "ByteLevel":
		return normByteLevel{}, nil
	case "":
		return nil, fmt.Errorf("normalizer without a type")
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", c.Type)
}
