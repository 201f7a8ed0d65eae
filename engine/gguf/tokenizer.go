package gguf

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ferrite-llm/ferrite/tokenizer"
)

// preSplit is a pre-tokenizer: the regexes Hugging Face's tokenizer.json
// of that family splits with, and its other settings.
type preSplit struct {
	splits       []string
	nfc          bool // the family's tokenizer.json normalizes to NFC (Qwen2)
	ignoreMerges bool // Llama 3's ignore_merges
	addBOS       bool // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
	// sentencePiece: tokenizer.ggml.model "llama", pieces with scores.
	sentencePiece bool
}

var (
	llama3Pre = preSplit{splits: []string{tokenizer.Llama3Regex}, ignoreMerges: true, addBOS: true}
	qwen2Pre  = preSplit{splits: []string{tokenizer.Qwen2Regex}, nfc: true}
	gpt2Pre   = preSplit{splits: []string{tokenizer.GPT2Regex}}
	glm4Pre   = preSplit{splits: []string{tokenizer.Llama3Regex}}
	// DeepSeek-V3's three Split steps.
	deepseekV3Pre = preSplit{splits: []string{
		`\p{N}{1,3}`,
		`[一-龥぀-ゟ゠-ヿ]+`,
		`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	}}
)

// preTokenizers maps tokenizer.ggml.pre (the names llama.cpp's
// convert_hf_to_gguf_update.py gives) to the pre-tokenizer.
var preTokenizers = map[string]preSplit{
	"llama3": llama3Pre, "llama-v3": llama3Pre, "llama-bpe": llama3Pre, "falcon3": llama3Pre, "pixtral": llama3Pre,
	"qwen2": qwen2Pre, "deepseek-r1-qwen": qwen2Pre, "megrez": qwen2Pre,
	"gpt2": gpt2Pre, "gpt-2": gpt2Pre, "phi-2": gpt2Pre, "olmo": gpt2Pre, "refact": gpt2Pre,
	"glm4": glm4Pre, "chatglm-bpe": glm4Pre,
	"deepseek-v3": deepseekV3Pre,
}

// Tokenizer builds the model's tokenizer from tokenizer.ggml.* and its chat
// template from tokenizer.chat_template: a byte-level BPE
// (tokenizer.ggml.model "gpt2", with the pre-tokenizer tokenizer.ggml.pre
// names) or a SentencePiece BPE ("llama": pieces and scores, byte
// fallback). Other tokenizer models are an error saying so.
func (m *Model) Tokenizer() (*tokenizer.Tokenizer, error) {
	meta, path := m.Meta, m.Path
	pre, err := m.preTokenizer()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	v := tokenizer.BPEVocab{
		Splits: pre.splits, NFC: pre.nfc, IgnoreMerges: pre.ignoreMerges,
		BOS: -1, PAD: -1, Unk: -1, AddBOS: pre.addBOS,
		ChatTemplate: meta.String("tokenizer.chat_template"),
		TemplateName: path + " tokenizer.chat_template",
	}
	tokens, err := stringArray(meta, path, "tokenizer.ggml.tokens", true)
	if err != nil {
		return nil, err
	}
	v.Tokens = tokens
	if pre.sentencePiece {
		if err := sentencePiece(meta, path, &v); err != nil {
			return nil, err
		}
	} else if v.Merges, err = stringArray(meta, path, "tokenizer.ggml.merges", true); err != nil {
		return nil, err
	}
	if tv, ok := meta.Get("tokenizer.ggml.token_type"); ok {
		types, ok := tv.Ints()
		if !ok || len(types) != len(tokens) {
			return nil, meta.metaErr(path, "tokenizer.ggml.token_type", tv, fmt.Sprintf("%d integers, one per token", len(tokens)))
		}
		v.Kinds = make([]tokenizer.TokenKind, len(types))
		for i, t := range types {
			v.Kinds[i] = tokenizer.TokenKind(t)
		}
	}
	id := func(key string) (int32, error) {
		u, ok, err := meta.uintKey(path, key)
		switch {
		case err != nil:
			return -1, err
		case !ok:
			return -1, nil
		case u >= uint64(len(tokens)):
			return -1, fmt.Errorf("%s: %s = %d is not below the vocabulary size %d", path, key, u, len(tokens))
		}
		return int32(u), nil
	}
	if v.BOS, err = id("tokenizer.ggml.bos_token_id"); err != nil {
		return nil, err
	}
	if v.PAD, err = id("tokenizer.ggml.padding_token_id"); err != nil {
		return nil, err
	}
	if v.Unk, err = id("tokenizer.ggml.unknown_token_id"); err != nil {
		return nil, err
	}
	if v.Unk < 0 && pre.sentencePiece {
		v.Unk = int32(slices.Index(v.Kinds, tokenizer.KindUnknown)) // -1 when none
	}
	// The end of a reply: eos, and the end-of-turn / end-of-message tokens
	// llama.cpp also stops at.
	for _, key := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		e, err := id(key)
		if err != nil {
			return nil, err
		}
		if e >= 0 && !slices.Contains(v.EOS, e) {
			v.EOS = append(v.EOS, e)
		}
	}
	if b, ok, err := meta.boolKey(path, "tokenizer.ggml.add_bos_token"); err != nil {
		return nil, err
	} else if ok {
		v.AddBOS = b
	}
	v.Sampling = recommendedSampling(meta)
	t, err := tokenizer.NewBPE(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// recommendedSampling is the sampling the file recommends: llama.cpp's
// general.sampling.temp, .top_p and .top_k, which its converter copies
// from generation_config.json (top_k ≤ 0 is off). A key of the wrong type
// is ignored: a recommendation never stops a load.
func recommendedSampling(meta Metadata) tokenizer.Sampling {
	var s tokenizer.Sampling
	num := func(key string) (float64, bool) {
		v, ok := meta.Get(key)
		if !ok {
			return 0, false
		}
		return v.Float()
	}
	if f, ok := num("general.sampling.temp"); ok {
		s.Temperature = &f
	}
	if f, ok := num("general.sampling.top_p"); ok {
		s.TopP = &f
	}
	if f, ok := num("general.sampling.top_k"); ok {
		k := max(int(f), 0)
		s.TopK = &k
	}
	return s
}

// errNoTokenizer is returned by Tokenizer for a file without tokenizer.ggml.model.
var errNoTokenizer = errors.New("no tokenizer (tokenizer.ggml.model is absent)")

// preTokenizer checks the tokenizer model and returns the pre-tokenizer
// tokenizer.ggml.pre names.
func (m *Model) preTokenizer() (preSplit, error) {
	switch kind := m.Meta.String("tokenizer.ggml.model"); kind {
	case "gpt2":
	case "":
		return preSplit{}, errNoTokenizer
	case "llama":
		return preSplit{sentencePiece: true, addBOS: true}, nil // llama.cpp's defaults for SentencePiece
	default:
		return preSplit{}, fmt.Errorf(`tokenizer.ggml.model %q is not supported; ferrite reads byte-level BPE ("gpt2") and SentencePiece ("llama")`, kind)
	}
	name := m.Meta.String("tokenizer.ggml.pre")
	pre, ok := preTokenizers[name]
	if name == "" || name == "default" {
		return preSplit{}, fmt.Errorf("no pre-tokenizer (tokenizer.ggml.pre %q): llama.cpp's default splitting is not supported; supported: %s",
			name, strings.Join(slices.Sorted(maps.Keys(preTokenizers)), ", "))
	}
	if !ok {
		return preSplit{}, fmt.Errorf("pre-tokenizer %q (tokenizer.ggml.pre) is not supported; supported: %s",
			name, strings.Join(slices.Sorted(maps.Keys(preTokenizers)), ", "))
	}
	return pre, nil
}

// sentencePiece reads a SentencePiece vocabulary's scores and
// tokenizer.ggml.add_space_prefix (true when absent, as in llama.cpp).
func sentencePiece(meta Metadata, path string, v *tokenizer.BPEVocab) error {
	sv, ok := meta.Get("tokenizer.ggml.scores")
	if !ok {
		return fmt.Errorf("%s: missing metadata tokenizer.ggml.scores (a SentencePiece vocabulary needs them)", path)
	}
	scores, ok := sv.Floats()
	if !ok || len(scores) != len(v.Tokens) {
		return meta.metaErr(path, "tokenizer.ggml.scores", sv, fmt.Sprintf("%d numbers, one per token", len(v.Tokens)))
	}
	v.SentencePiece, v.Scores = true, make([]float32, len(scores))
	for i, s := range scores {
		v.Scores[i] = float32(s)
	}
	v.AddSpacePrefix = true
	if b, ok, err := meta.boolKey(path, "tokenizer.ggml.add_space_prefix"); err != nil {
		return err
	} else if ok {
		v.AddSpacePrefix = b
	}
	return nil
}

// stringArray reads an array-of-strings key.
func stringArray(meta Metadata, path, key string, required bool) ([]string, error) {
	v, ok := meta.Get(key)
	if !ok {
		if required {
			return nil, fmt.Errorf("%s: missing metadata %s", path, key)
		}
		return nil, nil
	}
	s, ok := v.Strings()
	if !ok {
		return nil, meta.metaErr(path, key, v, "an array of strings")
	}
	return s, nil
}
