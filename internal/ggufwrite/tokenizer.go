package ggufwrite

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Token types of tokenizer.ggml.token_type.
const (
	tokNormal      = 1
	tokControl     = 3
	tokUserDefined = 4
	tokUnused      = 5
)

// AddTokenizerJSON adds the tokenizer.ggml.* keys for the byte-level BPE
// tokenizer.json at path (gzip-compressed when it ends in .gz), as
// convert_hf_to_gguf's _set_vocab_gpt2 does: every id up to the largest
// gets a token (missing ones "[PADn]", unused), added tokens are control
// (special) or user-defined, merges are "a b" strings.
func AddTokenizerJSON(w *Writer, path, pre string, bos, eos int32) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return err
		}
		if data, err = io.ReadAll(zr); err != nil {
			return err
		}
	}
	var tj struct {
		AddedTokens []struct {
			ID      int32  `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int32  `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		return err
	}
	n := int32(0)
	for _, id := range tj.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range tj.AddedTokens {
		n = max(n, a.ID+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), tokUnused
	}
	for s, id := range tj.Model.Vocab {
		tokens[id], types[id] = s, tokNormal
	}
	for _, a := range tj.AddedTokens {
		tokens[a.ID], types[a.ID] = a.Content, tokUserDefined
		if a.Special {
			types[a.ID] = tokControl
		}
	}
	merges := make([]string, len(tj.Model.Merges))
	for i, m := range tj.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) == nil {
			merges[i] = s
			continue
		}
		var pair []string
		if err := json.Unmarshal(m, &pair); err != nil || len(pair) != 2 {
			return fmt.Errorf("merge %d: %s", i, m)
		}
		merges[i] = pair[0] + " " + pair[1]
	}
	addTokenizer(w, pre, tokens, types, merges, bos, eos)
	return nil
}

func addTokenizer(w *Writer, pre string, tokens []string, types []int32, merges []string, bos, eos int32) {
	w.Add("tokenizer.ggml.model", "gpt2")
	w.Add("tokenizer.ggml.pre", pre)
	w.Add("tokenizer.ggml.tokens", tokens)
	w.Add("tokenizer.ggml.token_type", types)
	w.Add("tokenizer.ggml.merges", merges)
	if bos >= 0 {
		w.Add("tokenizer.ggml.bos_token_id", uint32(bos))
	}
	if eos >= 0 {
		w.Add("tokenizer.ggml.eos_token_id", uint32(eos))
	}
}

// ChatML is a minimal ChatML chat template.
const ChatML = `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// AddByteTokenizer adds a tiny byte-level BPE tokenizer of vocab tokens for
// the fixture models (whose vocabularies are a few hundred ids): the 256
// byte tokens, merges of a few common pairs, the ChatML control tokens
// <|endoftext|> (eos), <|im_start|>, <|im_end|>, padding up to vocab, and
// the ChatML template.
func AddByteTokenizer(w *Writer, vocab int) {
	var tokens []string
	for b := range 256 {
		tokens = append(tokens, string(byteRune(byte(b))))
	}
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = tokNormal
	}
	var merges []string
	for _, pair := range [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"e", "r"}} {
		merges = append(merges, pair[0]+" "+pair[1])
		tokens = append(tokens, pair[0]+pair[1])
		types = append(types, tokNormal)
	}
	special := []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
	eos := int32(len(tokens))
	for _, s := range special {
		tokens = append(tokens, s)
		types = append(types, tokControl)
	}
	for len(tokens) < vocab {
		tokens = append(tokens, fmt.Sprintf("[PAD%d]", len(tokens)))
		types = append(types, tokUnused)
	}
	addTokenizer(w, "qwen2", tokens, types, merges, -1, eos)
	w.Add("tokenizer.ggml.eot_token_id", uint32(eos+2)) // <|im_end|>
	w.Add("tokenizer.chat_template", ChatML)
}

// byteRune is GPT-2's byte-to-unicode mapping.
func byteRune(b byte) rune {
	switch {
	case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE:
		return rune(b)
	}
	n := 0
	for c := 0; c < int(b); c++ {
		if !(c >= '!' && c <= '~' || c >= 0xA1 && c <= 0xAC || c >= 0xAE) {
			n++
		}
	}
	return rune(256 + n)
}

// ConvertWithTokenizer is Convert plus AddByteTokenizer sized to the
// model's vocabulary: a GGUF file ferrite can chat with.
func ConvertWithTokenizer(dir string, typ uint32) (*Writer, error) {
	w, err := Convert(dir, typ)
	if err != nil {
		return nil, err
	}
	for _, t := range w.Tensors {
		if t.Name == "token_embd.weight" {
			AddByteTokenizer(w, int(t.Dims[1]))
			return w, nil
		}
	}
	return nil, fmt.Errorf("ggufwrite: %s has no token_embd.weight", dir)
}
