package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// AddedToken is an entry of tokenizer.json's added_tokens.
type AddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// trie finds added tokens, leftmost-longest (daachorse MatchKind::LeftmostLongest).
type trie struct {
	nodes []trieNode
	first [256]bool // bytes that start some token
}

type trieNode struct {
	next map[byte]int32
	id   int32 // token id ending here, or -1
}

func newTrie() *trie { return &trie{nodes: []trieNode{{id: -1}}} }

func (t *trie) add(s string, id int32) {
	if s == "" {
		return // a token that normalizes to nothing can never match
	}
	t.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		nx, ok := t.nodes[n].next[c]
		if !ok {
			if t.nodes[n].next == nil {
				t.nodes[n].next = map[byte]int32{}
			}
			t.nodes = append(t.nodes, trieNode{id: -1})
			nx = int32(len(t.nodes) - 1)
			t.nodes[n].next[c] = nx
		}
		n = nx
	}
	t.nodes[n].id = id
}

// longestAt returns the id and end of the longest token starting at i.
func (t *trie) longestAt(s string, i int) (int32, int) {
	n := int32(0)
	best, end := int32(-1), -1
	for j := i; j < len(s); j++ {
		nx, ok := t.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = nx
		if t.nodes[n].id >= 0 {
			best, end = t.nodes[n].id, j+1
		}
	}
	return best, end
}

type tokMatch struct {
	start, end int
	id         int32
}

// findAll returns the leftmost-longest non-overlapping matches.
func (t *trie) findAll(s string) []tokMatch {
	var out []tokMatch
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		id, e := t.longestAt(s, i)
		if id < 0 {
			i++
			continue
		}
		out = append(out, tokMatch{i, e, id})
		i = e
	}
	return out
}

// addedVocab holds the added tokens, as AddedVocabulary does.
type addedVocab struct {
	byID      map[int32]*AddedToken
	byContent map[string]int32
	special   map[string]bool
	normCache map[int32]string // normalized content of normalized tokens, when it differs
	raw       *trie            // tokens with normalized=false, matched on the input
	norm      *trie            // tokens with normalized=true, matched after normalization
}

// newAddedVocab adds the tokens the way AddedVocabulary::add_tokens does
// when tokenizer.json is read: the id in the file is only a hint; a token
// already in the model vocab keeps that id, others get the next free ids
// after the model vocab, in file order.
func newAddedVocab(tokens []AddedToken, m *bpeModel, n normalizer) *addedVocab {
	v := &addedVocab{
		byID:      map[int32]*AddedToken{},
		byContent: map[string]int32{},
		special:   map[string]bool{},
		normCache: map[int32]string{},
	}
	next := int32(len(m.vocab))
	for i := range tokens {
		t := tokens[i]
		if t.Content == "" {
			continue
		}
		if id, ok := v.byContent[t.Content]; ok {
			if old := v.byID[id]; old != nil && sameFlags(*old, t) {
				continue
			}
		}
		var id int32
		if x, ok := v.byContent[t.Content]; ok {
			id = x
		} else if x, ok := m.vocab[t.Content]; ok {
			id = x
		} else {
			id = next
			next++
		}
		t.ID = id
		if t.Normalized && n != nil {
			if s, _ := n.normalize(t.Content, true); s != t.Content {
				v.normCache[id] = s
			}
		}
		v.byContent[t.Content] = id
		if t.Special {
			v.special[t.Content] = true
		}
		tt := t
		v.byID[id] = &tt
	}
	v.raw, v.norm = newTrie(), newTrie()
	for id, t := range v.byID {
		if t.Normalized {
			s := t.Content
			if c, ok := v.normCache[id]; ok {
				s = c
			}
			v.norm.add(s, id)
		} else {
			v.raw.add(t.Content, id)
		}
	}
	return v
}

func sameFlags(a, b AddedToken) bool {
	a.ID, b.ID = 0, 0
	return a == b
}

// split cuts s at the added tokens of trie t (find_matches), honouring
// single_word, lstrip and rstrip, and appends the pieces to out. Empty
// pieces are dropped.
func (v *addedVocab) split(s string, t *trie, atStart bool, out []piece) []piece {
	if len(t.nodes[0].next) == 0 || s == "" {
		if s != "" {
			out = append(out, piece{s: s, id: -1, atStart: atStart})
		}
		return out
	}
	startOff := 0
	emit := func(a, b int, id int32) {
		if b > a {
			out = append(out, piece{s: s[a:b], id: id, atStart: atStart && a == 0})
		}
	}
	for _, m := range t.findAll(s) {
		start, stop := m.start, m.end
		tok := v.byID[m.id]
		if tok.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			start = max(leftmostSpaceAtEnd(s[:start]), startOff)
		}
		if tok.RStrip {
			stop += rightmostSpaceAtStart(s[stop:])
		}
		if startOff < start {
			emit(startOff, start, -1)
		}
		out = append(out, piece{s: s[start:stop], id: m.id})
		startOff = stop
	}
	if startOff < len(s) {
		emit(startOff, len(s), -1)
	}
	return out
}

// Rust regex \w (Unicode): Alphabetic, marks, decimal digits, connector
// punctuation, join controls.
func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}

func leftmostSpaceAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

func rightmostSpaceAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
