package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// byteToRune is GPT-2's bytes_to_unicode table; runeToByte its inverse.
var (
	byteToRune [256]rune
	byteToStr  [256]string
	runeToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		byteToStr[b] = string(byteToRune[b])
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelString maps every byte of s to its byte-level character.
func byteLevelString(s string) string {
	var b strings.Builder
	b.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		b.WriteString(byteToStr[s[i]])
	}
	return b.String()
}

// bpeModel is the BPE model of tokenizer.json.
type bpeModel struct {
	vocab       map[string]int32
	vocabR      map[int32]string
	merges      map[uint64]merge // (left id << 32 | right id) -> merge
	unk         int32            // -1: none
	unkToken    string
	fuseUnk     bool
	byteFB      bool
	ignoreMerge bool
	prefix      string // continuing_subword_prefix
	suffix      string // end_of_word_suffix
	// byteSym[b]: id of byte b's byte-level character when it is a whole
	// vocab entry and no prefix/suffix applies (-1 otherwise).
	byteSym   [256]int32
	fastBytes bool
	// byteFBID[b]: id of "<0xXX>", or -1.
	byteFBID [256]int32

	mu    sync.RWMutex
	cache map[string][]int32
}

type merge struct {
	rank  uint32
	newID int32
}

const (
	cacheMaxEntries = 1 << 16
	cacheMaxWordLen = 256
)

type bpeConfig struct {
	Type                    string           `json:"type"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Dropout                 *float64         `json:"dropout"`
}

func parseModel(raw json.RawMessage) (*bpeModel, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("model is missing")
	}
	var c bpeConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if c.Type != "BPE" && !(c.Type == "" && c.Vocab != nil && c.Merges != nil) {
		return nil, fmt.Errorf("model: unsupported model type %q (only BPE)", c.Type)
	}
	if c.Vocab == nil {
		return nil, fmt.Errorf("model: vocab is missing")
	}
	if c.Dropout != nil && *c.Dropout != 0 {
		return nil, fmt.Errorf("model: dropout %v is not supported (inference only)", *c.Dropout)
	}
	m := &bpeModel{
		vocab:       c.Vocab,
		vocabR:      make(map[int32]string, len(c.Vocab)),
		merges:      map[uint64]merge{},
		unk:         -1,
		fuseUnk:     c.FuseUnk,
		byteFB:      c.ByteFallback,
		ignoreMerge: c.IgnoreMerges,
		cache:       map[string][]int32{},
	}
	for tok, id := range c.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model: vocab entry %q has negative id %d", tok, id)
		}
		m.vocabR[id] = tok
	}
	if c.ContinuingSubwordPrefix != nil {
		m.prefix = *c.ContinuingSubwordPrefix
	}
	if c.EndOfWordSuffix != nil {
		m.suffix = *c.EndOfWordSuffix
	}
	if c.UnkToken != nil {
		m.unkToken = *c.UnkToken
	}
	pairs, err := parseMerges(c.Merges)
	if err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}
	m.merges = make(map[uint64]merge, len(pairs))
	for i, p := range pairs {
		a, ok := m.vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in the vocab", i, p[0])
		}
		b, ok := m.vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in the vocab", i, p[1])
		}
		if len(p[1]) < len(m.prefix) {
			return nil, fmt.Errorf("model.merges[%d]: %q is shorter than continuing_subword_prefix", i, p[1])
		}
		joined := p[0] + p[1][len(m.prefix):]
		n, ok := m.vocab[joined]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: merged token %q is not in the vocab", i, joined)
		}
		// A later duplicate overwrites an earlier one, as in Rust's collect.
		m.merges[uint64(uint32(a))<<32|uint64(uint32(b))] = merge{uint32(i), n}
	}
	m.fastBytes = m.prefix == "" && m.suffix == ""
	for b := 0; b < 256; b++ {
		m.byteSym[b] = -1
		if id, ok := m.vocab[byteToStr[b]]; ok {
			m.byteSym[b] = id
		}
		m.byteFBID[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteFBID[b] = id
		}
	}
	return m, nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("not a list: %w", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("[%d]: %q is not two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("[%d]: want \"a b\" or [\"a\", \"b\"], got %.60s", i, it)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// tokenize appends the ids of one pre-tokenized piece to dst.
func (m *bpeModel) tokenize(p piece, dst []int32) []int32 {
	if p.s == "" {
		return dst
	}
	if m.ignoreMerge {
		if id, ok := m.vocab[p.text()]; ok {
			return append(dst, id)
		}
	}
	cacheable := len(p.s) < cacheMaxWordLen
	key := p.s
	if cacheable {
		if !p.mapped {
			key = "\x00" + p.s // keep apart from mapped pieces with equal bytes
		}
		m.mu.RLock()
		ids, ok := m.cache[key]
		m.mu.RUnlock()
		if ok {
			return append(dst, ids...)
		}
	}
	ids := m.mergeWord(p)
	if cacheable {
		m.mu.Lock()
		if len(m.cache) >= cacheMaxEntries {
			clear(m.cache)
		}
		m.cache[key] = ids
		m.mu.Unlock()
	}
	return append(dst, ids...)
}

type symbol struct {
	id         int32
	prev, next int32
	gone       bool
}

// initial returns the starting symbols of a word (merge_word before merging).
func (m *bpeModel) initial(p piece) []symbol {
	syms := make([]symbol, 0, len(p.s))
	add := func(id int32) {
		syms = append(syms, symbol{id: id, prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	if p.mapped && m.fastBytes {
		ok := true
		for i := 0; i < len(p.s); i++ {
			if m.byteSym[p.s[i]] < 0 {
				ok = false
				break
			}
		}
		if ok {
			for i := 0; i < len(p.s); i++ {
				add(m.byteSym[p.s[i]])
			}
			return syms
		}
	}
	w := p.text()
	unk := int32(-1)
	hasUnk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		s := w[i : i+n]
		if i > 0 && m.prefix != "" {
			s = m.prefix + s
		}
		if i+n == len(w) && m.suffix != "" {
			s += m.suffix
		}
		i += n
		if id, ok := m.vocab[s]; ok {
			if hasUnk {
				add(unk)
				hasUnk = false
			}
			add(id)
			continue
		}
		if m.byteFB {
			ok := true
			for j := 0; j < len(s); j++ {
				if m.byteFBID[s[j]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				// A pending unk stays pending: Rust adds it only before the
				// next char found in the vocab, or at the end, so it can
				// come after these bytes.
				for j := 0; j < len(s); j++ {
					add(m.byteFBID[s[j]])
				}
				continue
			}
		}
		if m.unkToken != "" {
			id, ok := m.vocab[m.unkToken]
			if !ok {
				// Rust errors here; we drop the piece's unknown char.
				continue
			}
			if hasUnk && !m.fuseUnk {
				add(unk)
			}
			unk, hasUnk = id, true
		}
	}
	if hasUnk {
		add(unk)
	}
	return syms
}

// mergeWord runs the BPE merges on a word: repeatedly merge the adjacent
// pair with the lowest rank (leftmost first), as Word::merge_all does.
func (m *bpeModel) mergeWord(p piece) []int32 {
	syms := m.initial(p)
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1
	if len(syms) > 1 && len(m.merges) > 0 {
		h := mergeHeap{}
		for i := 0; i+1 < len(syms); i++ {
			if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
				h.push(mergeItem{mg.rank, int32(i), mg.newID})
			}
		}
		for len(h) > 0 {
			top := h.pop()
			cur := &syms[top.pos]
			if cur.gone || cur.next < 0 {
				continue
			}
			right := &syms[cur.next]
			mg, ok := m.merges[pairKey(cur.id, right.id)]
			if !ok || mg.newID != top.newID {
				continue
			}
			cur.id = top.newID
			right.gone = true
			cur.next = right.next
			if cur.next >= 0 {
				syms[cur.next].prev = top.pos
			}
			if cur.prev >= 0 {
				if mg, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
					h.push(mergeItem{mg.rank, cur.prev, mg.newID})
				}
			}
			if cur.next >= 0 {
				if mg, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
					h.push(mergeItem{mg.rank, top.pos, mg.newID})
				}
			}
		}
	}
	out := make([]int32, 0, len(syms))
	for i := range syms {
		if !syms[i].gone {
			out = append(out, syms[i].id)
		}
	}
	return out
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type mergeItem struct {
	rank  uint32
	pos   int32
	newID int32
}

func (a mergeItem) less(b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// mergeHeap is a binary min-heap on (rank, pos).
type mergeHeap []mergeItem

func (h *mergeHeap) push(x mergeItem) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && s[r].less(s[l]) {
			c = r
		}
		if !s[c].less(s[i]) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}
