package tokenizer

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"
)

// TokenKind is what a vocabulary entry is, as GGUF's tokenizer.ggml.token_type
// says (llama.cpp's llama_token_type, the same numbers).
type TokenKind int32

// The token kinds.
const (
	KindUndefined   TokenKind = 0
	KindNormal      TokenKind = 1 // an ordinary BPE token
	KindUnknown     TokenKind = 2
	KindControl     TokenKind = 3 // special: matched whole in text, dropped by Decode(skipSpecial)
	KindUserDefined TokenKind = 4 // added: matched whole in text, decoded as text
	KindUnused      TokenKind = 5 // padding of the vocabulary, never produced
	KindByte        TokenKind = 6
)

// BPEVocab is a byte-level BPE tokenizer given as plain lists, the way a GGUF
// file carries one (tokenizer.ggml.*).
type BPEVocab struct {
	Tokens []string    // by id, in the byte-level alphabet (Ġ for space, ...)
	Kinds  []TokenKind // by id; nil means all normal
	Merges []string    // "a b", highest priority first

	// Splits are the pre-tokenizer's regexes (Oniguruma syntax, as in
	// tokenizer.json), each splitting the pieces of the previous one with
	// the matches isolated, before the byte-level mapping.
	Splits       []string
	NFC          bool // normalize the text to NFC first
	IgnoreMerges bool // a piece that is a whole token is not merged (Llama 3)

	// SentencePiece: Tokens are SentencePiece pieces (▁ for a space) with
	// Scores, and Merges is ignored: two adjacent pieces merge when their
	// concatenation is a piece, the one with the higher score first (see
	// MergesFromScores); characters no piece covers fall back to the
	// <0xXX> byte pieces, else Unk. AddSpacePrefix prepends ▁ to the text.
	SentencePiece  bool
	Scores         []float32
	AddSpacePrefix bool
	Unk            int32 // -1 when none

	BOS    int32   // -1 when none
	EOS    []int32 // end-of-generation ids
	PAD    int32   // -1 when none
	AddBOS bool    // Encode with special tokens prepends BOS

	ChatTemplate string // Jinja source; "" when none
	TemplateName string // names the template in errors

	Sampling Sampling // the sampling the model's file recommends (Tokenizer.Sampling)
}

// NewBPE builds a Tokenizer from a BPEVocab. It goes through the same
// tokenizer.json parser Load uses, so both behave identically.
func NewBPE(v BPEVocab) (*Tokenizer, error) {
	if len(v.Tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary")
	}
	if v.Kinds != nil && len(v.Kinds) != len(v.Tokens) {
		return nil, fmt.Errorf("tokenizer: %d token kinds for %d tokens", len(v.Kinds), len(v.Tokens))
	}
	if v.SentencePiece && len(v.Scores) != len(v.Tokens) {
		return nil, fmt.Errorf("tokenizer: %d scores for %d SentencePiece tokens", len(v.Scores), len(v.Tokens))
	}
	if v.Unk >= int32(len(v.Tokens)) {
		return nil, fmt.Errorf("tokenizer: unk %d is not below the vocabulary size %d", v.Unk, len(v.Tokens))
	}
	vocab := make(map[string]int32, len(v.Tokens))
	var added []AddedToken
	for i, s := range v.Tokens {
		id := int32(i)
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("tokenizer: token %d %q is not valid UTF-8", i, s)
		}
		kind := KindNormal
		if v.Kinds != nil {
			kind = v.Kinds[i]
		}
		switch kind {
		case KindControl, KindUserDefined:
			added = append(added, AddedToken{ID: id, Content: s, Special: kind == KindControl})
		case KindUnknown: // a vocabulary entry (what unknown text becomes) and special, as in transformers
			added = append(added, AddedToken{ID: id, Content: s, Special: true})
			if _, dup := vocab[s]; !dup {
				vocab[s] = id
			}
		case KindUnused:
			continue
		default:
			if _, dup := vocab[s]; !dup {
				vocab[s] = id
			}
		}
	}
	if v.BOS >= int32(len(v.Tokens)) || v.PAD >= int32(len(v.Tokens)) {
		return nil, fmt.Errorf("tokenizer: bos %d or pad %d is not below the vocabulary size %d", v.BOS, v.PAD, len(v.Tokens))
	}
	for _, id := range v.EOS {
		if id < 0 || id >= int32(len(v.Tokens)) {
			return nil, fmt.Errorf("tokenizer: eos %d is not in the vocabulary of %d", id, len(v.Tokens))
		}
	}
	if added == nil {
		added = []AddedToken{}
	}
	model := map[string]any{"type": "BPE", "vocab": vocab, "ignore_merges": v.IgnoreMerges, "fuse_unk": false, "byte_fallback": false}
	tj := map[string]any{"version": "1.0", "added_tokens": added, "post_processor": nil, "model": model}
	if v.SentencePiece {
		// What transformers' LlamaConverter makes of a SentencePiece BPE.
		norm := []any{map[string]any{"type": "Replace", "pattern": map[string]string{"String": " "}, "content": "▁"}}
		strip := 0
		if v.AddSpacePrefix {
			norm = append([]any{map[string]string{"type": "Prepend", "prepend": "▁"}}, norm...)
			strip = 1
		}
		tj["normalizer"] = map[string]any{"type": "Sequence", "normalizers": norm}
		tj["pre_tokenizer"] = nil
		tj["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]string{"String": "▁"}, "content": " "},
			map[string]string{"type": "ByteFallback"}, map[string]string{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": strip, "stop": 0},
		}}
		model["merges"] = MergesFromScores(v.Tokens, v.Scores, func(s string) bool { _, ok := vocab[s]; return ok })
		model["fuse_unk"], model["byte_fallback"] = true, true
		if v.Unk >= 0 {
			model["unk_token"] = v.Tokens[v.Unk]
		}
	} else {
		byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
		var pre []any
		for _, re := range v.Splits {
			pre = append(pre, map[string]any{"type": "Split", "pattern": map[string]string{"Regex": re}, "behavior": "Isolated", "invert": false})
		}
		tj["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": append(pre, byteLevel)}
		tj["decoder"] = byteLevel
		if v.NFC {
			tj["normalizer"] = map[string]string{"type": "NFC"}
		}
		merges := v.Merges
		if merges == nil {
			merges = []string{}
		}
		model["merges"] = merges
	}
	data, err := json.Marshal(tj)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseTokenizer(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t.vocabSize = max(t.vocabSize, len(v.Tokens))
	t.bos, t.pad, t.addBOS = v.BOS, v.PAD, v.AddBOS && v.BOS >= 0
	for _, id := range v.EOS {
		t.eos = appendUnique(t.eos, id)
	}
	for name, id := range map[string]int32{"bos_token": v.BOS, "pad_token": v.PAD} {
		if id >= 0 {
			t.specialNames[name] = v.Tokens[id]
		}
	}
	if len(v.EOS) > 0 {
		t.specialNames["eos_token"] = v.Tokens[v.EOS[0]]
	}
	t.chatTemplate, t.templateName = v.ChatTemplate, v.TemplateName
	t.sampling = v.Sampling
	return t, nil
}

// MergesFromScores derives BPE merges from SentencePiece scores, as
// transformers' SentencePieceExtractor does: every split of a piece into
// two pieces (inVocab) is a merge, ranked by the whole piece's score,
// highest first; ties keep the pieces' id order, then the halves' ids.
func MergesFromScores(tokens []string, scores []float32, inVocab func(string) bool) [][2]string {
	ids := make(map[string]int, len(tokens))
	for i, s := range tokens {
		if _, dup := ids[s]; !dup {
			ids[s] = i
		}
	}
	type merge struct {
		l, r  string
		score float32
	}
	var out []merge
	for i, s := range tokens {
		if !inVocab(s) {
			continue
		}
		var local []merge
		for j := range s {
			if j == 0 {
				continue
			}
			l, r := s[:j], s[j:]
			if inVocab(l) && inVocab(r) {
				local = append(local, merge{l, r, scores[i]})
			}
		}
		slices.SortStableFunc(local, func(a, b merge) int {
			if c := cmp.Compare(ids[a.l], ids[b.l]); c != 0 {
				return c
			}
			return cmp.Compare(ids[a.r], ids[b.r])
		})
		out = append(out, local...)
	}
	slices.SortStableFunc(out, func(a, b merge) int { return cmp.Compare(b.score, a.score) })
	pairs := make([][2]string, len(out))
	for i, m := range out {
		pairs[i] = [2]string{m.l, m.r}
	}
	return pairs
}
