package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder is one step of tokenizer.json's decoder (Decoder::decode_chain).
type decoder interface {
	decodeChain(toks []string) []string
}

type decSeq []decoder

func (d decSeq) decodeChain(toks []string) []string {
	for _, x := range d {
		toks = x.decodeChain(toks)
	}
	return toks
}

// tokenBytes is the ByteLevel decoding of one token: its characters mapped
// back to bytes, or its UTF-8 bytes when some character is not byte-level.
func tokenBytes(dst []byte, t string) []byte {
	k := len(dst)
	for _, r := range t {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:k], t...)
		}
		dst = append(dst, b)
	}
	return dst
}

type decByteLevel struct{}

func (decByteLevel) decodeChain(toks []string) []string {
	var b []byte
	for _, t := range toks {
		b = tokenBytes(b, t)
	}
	out, _ := appendLossy(nil, b, true)
	return []string{string(out)}
}

type decByteFallback struct{}

func byteFallbackValue(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	// u8::from_str_radix(&t[3..5], 16)
	h := t[3:5]
	if h[0] == '+' {
		h = h[1:]
	}
	var v byte
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			v = v*16 + c - '0'
		case c >= 'a' && c <= 'f':
			v = v*16 + c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = v*16 + c - 'A' + 10
		default:
			return 0, false
		}
	}
	return v, true
}

func (decByteFallback) decodeChain(toks []string) []string {
	out := make([]string, 0, len(toks))
	var pend []byte
	flush := func() {
		if len(pend) == 0 {
			return
		}
		if utf8.Valid(pend) {
			out = append(out, string(pend))
		} else {
			for range pend {
				out = append(out, "\uFFFD")
			}
		}
		pend = pend[:0]
	}
	for _, t := range toks {
		if b, ok := byteFallbackValue(t); ok {
			pend = append(pend, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type decFuse struct{}

func (decFuse) decodeChain(toks []string) []string { return []string{strings.Join(toks, "")} }

type decStrip struct {
	content     rune
	start, stop int
}

func (d decStrip) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		rs := []rune(t)
		a := 0
		for j := 0; j < d.start && j < len(rs); j++ {
			if rs[j] != d.content {
				break
			}
			a = j + 1
		}
		b := len(rs)
		for j := 0; j < d.stop; j++ {
			k := len(rs) - j - 1
			if k < 0 || rs[k] != d.content {
				break
			}
			b = k
		}
		if b < a {
			b = a
		}
		out[i] = string(rs[a:b])
	}
	return out
}

type decReplace struct {
	pat     pattern
	content string
}

func (d decReplace) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = replaceAll(d.pat, t, d.content)
	}
	return out
}

type decMetaspace struct {
	rep     rune
	prepend bool // prepend_scheme != never
}

func (d decMetaspace) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		var b strings.Builder
		for _, r := range t {
			if r == d.rep {
				if i == 0 && d.prepend {
					continue
				}
				r = ' '
			}
			b.WriteRune(r)
		}
		out[i] = b.String()
	}
	return out
}

type decBPE struct{ suffix string }

func (d decBPE) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		rep := " "
		if i == len(toks)-1 {
			rep = ""
		}
		out[i] = strings.ReplaceAll(t, d.suffix, rep)
	}
	return out
}

type decConfig struct {
	Type          string            `json:"type"`
	Decoders      []json.RawMessage `json:"decoders"`
	Pattern       patternConfig     `json:"pattern"`
	Content       json.RawMessage   `json:"content"`
	Start         int               `json:"start"`
	Stop          int               `json:"stop"`
	Replacement   string            `json:"replacement"`
	PrependScheme string            `json:"prepend_scheme"`
	AddPrefix     *bool             `json:"add_prefix_space"`
	Suffix        *string           `json:"suffix"`
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c decConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return parseSeq[decSeq]("decoders", c.Decoders, parseDecoder)
	case "ByteLevel":
		return decByteLevel{}, nil
	case "ByteFallback":
		return decByteFallback{}, nil
	case "Fuse":
		return decFuse{}, nil
	case "Strip":
		var s string
		if err := json.Unmarshal(c.Content, &s); err != nil || utf8.RuneCountInString(s) != 1 {
			return nil, fmt.Errorf("Strip: content must be one character")
		}
		r, _ := utf8.DecodeRuneInString(s)
		return decStrip{content: r, start: c.Start, stop: c.Stop}, nil
	case "Replace":
		p, err := c.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		var s string
		if err := json.Unmarshal(c.Content, &s); err != nil {
			return nil, fmt.Errorf("Replace: content must be a string")
		}
		return decReplace{p, s}, nil
	case "Metaspace":
		if utf8.RuneCountInString(c.Replacement) != 1 {
			return nil, fmt.Errorf("Metaspace: replacement must be one character, got %q", c.Replacement)
		}
		r, _ := utf8.DecodeRuneInString(c.Replacement)
		scheme := c.PrependScheme
		if c.AddPrefix != nil && !*c.AddPrefix {
			scheme = "never"
		}
		return decMetaspace{rep: r, prepend: scheme != "never"}, nil
	case "BPEDecoder":
		suf := "</w>"
		if c.Suffix != nil {
			suf = *c.Suffix
		}
		return decBPE{suf}, nil
	case "":
		return nil, fmt.Errorf("decoder without a type")
	}
	return nil, fmt.Errorf("unsupported decoder type %q", c.Type)
}

// appendLossy appends src to dst as valid UTF-8, replacing each maximal
// invalid subpart with U+FFFD as Rust's String::from_utf8_lossy does. With
// final false, an incomplete sequence at the end of src is not converted;
// its bytes are returned as rest.
func appendLossy(dst, src []byte, final bool) (out, rest []byte) {
	for i := 0; i < len(src); {
		c := src[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
			need = 2
		case c == 0xED:
			need, hi = 2, 0x9F
		case c == 0xF0:
			need, lo = 3, 0x90
		case c >= 0xF1 && c <= 0xF3:
			need = 3
		case c == 0xF4:
			need, hi = 3, 0x8F
		default:
			dst = append(dst, "\uFFFD"...)
			i++
			continue
		}
		j := i + 1
		ok := true
		for k := 0; k < need; k++ {
			if j >= len(src) {
				if !final {
					return dst, src[i:]
				}
				ok = false
				break
			}
			b := src[j]
			if k == 0 {
				if b < lo || b > hi {
					ok = false
					break
				}
			} else if b < 0x80 || b > 0xBF {
				ok = false
				break
			}
			j++
		}
		if ok {
			dst = append(dst, src[i:j]...)
		} else {
			dst = append(dst, "\uFFFD"...)
		}
		i = j
	}
	return dst, nil
}

// sanitizeUTF8 replaces every byte of s that is not part of a valid UTF-8
// sequence with U+FFFD, one replacement per byte (as a Go range loop sees
// the string).
func sanitizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		b.WriteRune(r) // invalid bytes arrive here one at a time as RuneError
	}
	return b.String()
}

// cleanUpSpaces is transformers' clean_up_tokenization: the same chain of
// str.replace calls, one after another.
func cleanUpSpaces(s string) string {
	for _, r := range cleanUpPairs {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

var cleanUpPairs = [][2]string{
	{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
	{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
}
