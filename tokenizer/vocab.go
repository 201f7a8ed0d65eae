package tokenizer

import (
	"encoding/json"
	"fmt"
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

	BOS    int32   // -1 when none
	EOS    []int32 // end-of-generation ids
	PAD    int32   // -1 when none
	AddBOS bool    // Encode with special tokens prepends BOS

	ChatTemplate string // Jinja source; "" when none
	TemplateName string // names the template in errors
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
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	var pre []any
	for _, re := range v.Splits {
		pre = append(pre, map[string]any{"type": "Split", "pattern": map[string]string{"Regex": re}, "behavior": "Isolated", "invert": false})
	}
	pre = append(pre, byteLevel)
	var norm any
	if v.NFC {
		norm = map[string]string{"type": "NFC"}
	}
	if added == nil {
		added = []AddedToken{}
	}
	merges := v.Merges
	if merges == nil {
		merges = []string{}
	}
	tj := map[string]any{
		"version":        "1.0",
		"added_tokens":   added,
		"normalizer":     norm,
		"pre_tokenizer":  map[string]any{"type": "Sequence", "pretokenizers": pre},
		"post_processor": nil,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": v.IgnoreMerges,
			"fuse_unk": false, "byte_fallback": false,
		},
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
	return t, nil
}
