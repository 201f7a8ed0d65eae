package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tokenizer encodes and decodes text for one model. It is safe for
// concurrent use.
type Tokenizer struct {
	model *bpeModel
	norm  normalizer
	pre   preTokenizer
	post  postProcessor
	dec   decoder
	added *addedVocab

	byteLevelDec bool // the decoder is exactly ByteLevel
	vocabSize    int

	bos, pad, unk int32 // -1 when absent
	eos           []int32
	specialNames  map[string]string // bos_token, eos_token, ... -> content
	addBOS        bool
	addEOS        bool
	cleanUp       bool

	sampling Sampling // generation_config.json's recommended sampling

	chatTemplate string
	templateName string
	tmplOnce     sync.Once
	tmpl         *compiledTemplate
	tmplErr      error
}

// Load reads the tokenizer in dir: tokenizer.json (or tokenizer.json.gz),
// and, when present, tokenizer_config.json (special tokens, add_bos_token,
// chat_template), chat_template.jinja (which wins over the config's
// template) and generation_config.json (more eos ids).
func Load(dir string) (*Tokenizer, error) {
	return loadFiles(dir,
		func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) },
		func(name string) string { return filepath.Join(dir, name) })
}

// loadFiles is Load over any file source: read returns a file of the model
// directory by name (an fs.ErrNotExist error when it is absent), and
// display turns a name into the path that error messages show.
func loadFiles(dir string, read func(name string) ([]byte, error), display func(name string) string) (tok *Tokenizer, err error) {
	defer func() {
		if r := recover(); r != nil {
			tok, err = nil, fmt.Errorf("tokenizer: %s: malformed tokenizer (internal error: %v)", dir, r)
		}
	}()
	tjPath := display("tokenizer.json")
	data, err := read("tokenizer.json")
	if errors.Is(err, fs.ErrNotExist) {
		gzPath := display("tokenizer.json.gz")
		var gz []byte
		if gz, err = read("tokenizer.json.gz"); err == nil {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(gz)); err == nil {
				data, err = io.ReadAll(zr)
			}
			if err != nil {
				return nil, fmt.Errorf("tokenizer: %s: %w", gzPath, err)
			}
			tjPath = gzPath
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: %s: %w", gzPath, err)
		} else {
			err = fmt.Errorf("%s: %w", tjPath, fs.ErrNotExist)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	optional := func(name string) ([]byte, error) {
		b, err := read(name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", display(name), err)
		}
		return b, nil
	}
	cfgPath, genPath, jinjaPath := display("tokenizer_config.json"), display("generation_config.json"), display("chat_template.jinja")
	cfg, err := optional("tokenizer_config.json")
	if err != nil {
		return nil, err
	}
	gen, err := optional("generation_config.json")
	if err != nil {
		return nil, err
	}
	jinja, err := optional("chat_template.jinja")
	if err != nil {
		return nil, err
	}
	t, err := parseTokenizer(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", tjPath, err)
	}
	if cfg != nil {
		if err := t.applyConfig(cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", cfgPath, err)
		}
	}
	if gen != nil {
		if err := t.applyGenerationConfig(gen); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", genPath, err)
		}
	}
	if jinja != nil {
		if !utf8.Valid(jinja) {
			return nil, fmt.Errorf("tokenizer: %s: not valid UTF-8", jinjaPath)
		}
		t.chatTemplate, t.templateName = string(jinja), jinjaPath
	} else if t.chatTemplate != "" {
		t.templateName = cfgPath + " chat_template"
	}
	return t, nil
}

// jsonError adds a line and column to JSON syntax errors.
func jsonError(data []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off := int(se.Offset)
		if off > len(data) {
			off = len(data)
		}
		line := 1 + bytes.Count(data[:off], []byte("\n"))
		col := off - bytes.LastIndexByte(data[:off], '\n')
		return fmt.Errorf("invalid JSON at line %d, column %d: %w", line, col, err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("field %q: %w", te.Field, err)
	}
	return err
}

type tokenizerJSON struct {
	Version       string          `json:"version"`
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

// parseTokenizer builds a Tokenizer from the bytes of a tokenizer.json.
func parseTokenizer(data []byte) (*Tokenizer, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, jsonError(data, err)
	}
	if tj.Version != "" && tj.Version != "1.0" {
		return nil, fmt.Errorf("unknown tokenizer.json version %q", tj.Version)
	}
	t := &Tokenizer{bos: -1, pad: -1, unk: -1, specialNames: map[string]string{}}
	var err error
	if t.model, err = parseModel(tj.Model); err != nil {
		return nil, err
	}
	if t.norm, err = parseNormalizer(tj.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(tj.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if t.post, err = parsePostProcessor(tj.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if t.dec, err = parseDecoder(tj.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	_, t.byteLevelDec = t.dec.(decByteLevel)
	for i, a := range tj.AddedTokens {
		if !utf8.ValidString(a.Content) {
			return nil, fmt.Errorf("added_tokens[%d]: content is not valid UTF-8", i)
		}
	}
	t.added = newAddedVocab(tj.AddedTokens, t.model, t.norm)
	maxID := int32(-1)
	for id := range t.model.vocabR {
		maxID = max(maxID, id)
	}
	for id := range t.added.byID {
		maxID = max(maxID, id)
	}
	t.vocabSize = int(maxID) + 1
	if t.model.unkToken != "" {
		if id, ok := t.TokenToID(t.model.unkToken); ok {
			t.unk = id
		}
	}
	return t, nil
}

type tokenizerConfig struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	PAD          json.RawMessage `json:"pad_token"`
	UNK          json.RawMessage `json:"unk_token"`
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	CleanUp      *bool           `json:"clean_up_tokenization_spaces"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// specialContent reads a special token given as a string, as
// {"content": "..."} or as null.
func specialContent(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("want a string or an object with content, got %.60s", raw)
	}
	return o.Content, nil
}

func (t *Tokenizer) applyConfig(data []byte) error {
	var c tokenizerConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return jsonError(data, err)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		id   *int32
	}{{"bos_token", c.BOS, &t.bos}, {"eos_token", c.EOS, nil}, {"pad_token", c.PAD, &t.pad}, {"unk_token", c.UNK, &t.unk}} {
		s, err := specialContent(f.raw)
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if s == "" {
			continue
		}
		t.specialNames[f.name] = s
		id, ok := t.TokenToID(s)
		if !ok {
			if f.name == "bos_token" || f.name == "eos_token" {
				return fmt.Errorf("%s %q is not in the vocabulary", f.name, s)
			}
			continue // a pad or unk token the model lacks is harmless
		}
		if f.id != nil {
			*f.id = id
		} else {
			t.eos = appendUnique(t.eos, id)
		}
	}
	if c.AddBOS != nil {
		t.addBOS = *c.AddBOS
	}
	if c.AddEOS != nil {
		t.addEOS = *c.AddEOS
	}
	if c.CleanUp != nil {
		t.cleanUp = *c.CleanUp
	}
	if !isNull(c.ChatTemplate) {
		var s string
		if err := json.Unmarshal(c.ChatTemplate, &s); err == nil {
			t.chatTemplate = s
		} else {
			var list []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(c.ChatTemplate, &list); err != nil {
				return fmt.Errorf("chat_template: want a string or a list of {name, template}")
			}
			for _, x := range list {
				if x.Name == "default" || t.chatTemplate == "" {
					t.chatTemplate = x.Template
				}
			}
		}
	}
	return nil
}

func appendUnique(s []int32, id int32) []int32 {
	for _, x := range s {
		if x == id {
			return s
		}
	}
	return append(s, id)
}

// Sampling is the sampling a model's files recommend: nil where they say
// nothing. generation_config.json is read as transformers reads it:
// do_sample false is greedy decoding, a Temperature of 0 (its other
// values are then unused).
type Sampling struct {
	Temperature *float64 // temperature; 0 is greedy
	TopP        *float64 // top_p
	TopK        *int     // top_k
}

// Sampling returns the sampling the model's generation_config.json
// recommends (all nil without one).
func (t *Tokenizer) Sampling() Sampling { return t.sampling }

func (t *Tokenizer) applyGenerationConfig(data []byte) error {
	var g struct {
		EOS         json.RawMessage `json:"eos_token_id"`
		BOS         *int32          `json:"bos_token_id"`
		DoSample    *bool           `json:"do_sample"`
		Temperature *float64        `json:"temperature"`
		TopP        *float64        `json:"top_p"`
		TopK        *int            `json:"top_k"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		return jsonError(data, err)
	}
	t.sampling = Sampling{Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK}
	if g.DoSample != nil && !*g.DoSample {
		greedy := 0.0
		t.sampling = Sampling{Temperature: &greedy}
	}
	if !isNull(g.EOS) {
		var one int32
		var many []int32
		if err := json.Unmarshal(g.EOS, &one); err == nil {
			many = []int32{one}
		} else if err := json.Unmarshal(g.EOS, &many); err != nil {
			return fmt.Errorf("eos_token_id: want an id or a list of ids, got %.60s", g.EOS)
		}
		for _, id := range many {
			if id < 0 || int(id) >= t.vocabSize {
				return fmt.Errorf("eos_token_id %d is outside the vocabulary (size %d)", id, t.vocabSize)
			}
			t.eos = appendUnique(t.eos, id)
		}
	}
	if g.BOS != nil && t.bos < 0 && *g.BOS >= 0 && int(*g.BOS) < t.vocabSize {
		t.bos = *g.BOS
	}
	return nil
}

// Encode returns the token ids of text. Special and other added tokens
// written in the text are recognised. With addSpecial the post-processor's
// tokens (BOS/EOS) are added, as add_special_tokens=True does. Invalid UTF-8
// in text is encoded as if each invalid byte were U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	text = sanitizeUTF8(text)
	ids := make([]int32, 0, len(text)/3+2)
	var words, sub []piece
	for _, p := range t.added.split(text, t.added.raw, true, nil) {
		if p.id >= 0 {
			ids = append(ids, p.id)
			continue
		}
		s, atStart := p.s, p.atStart
		if t.norm != nil {
			s, atStart = t.norm.normalize(s, atStart)
		}
		sub = t.added.split(s, t.added.norm, atStart, sub[:0])
		for _, q := range sub {
			if q.id >= 0 {
				ids = append(ids, q.id)
				continue
			}
			if t.pre == nil {
				ids = t.model.tokenize(q, ids)
				continue
			}
			words = t.pre.split(q, words[:0])
			for _, w := range words {
				ids = t.model.tokenize(w, ids)
			}
		}
	}
	if !addSpecial {
		return ids
	}
	if t.post != nil {
		ids = t.post.process(ids, true)
	}
	if t.addBOS && t.bos >= 0 && (len(ids) == 0 || ids[0] != t.bos) {
		ids = append([]int32{t.bos}, ids...)
	}
	if t.addEOS && len(t.eos) > 0 && (len(ids) == 0 || ids[len(ids)-1] != t.eos[0]) {
		ids = append(ids, t.eos[0])
	}
	return ids
}

// idToken is the string Decode uses for id: an added token's (normalized)
// content or the model's token.
func (t *Tokenizer) idToken(id int32) (string, bool) {
	if a, ok := t.added.byID[id]; ok {
		if s, ok := t.added.normCache[id]; ok {
			return s, true
		}
		return a.Content, true
	}
	s, ok := t.model.vocabR[id]
	return s, ok
}

// Decode returns the text of ids. Unknown ids are skipped; with skipSpecial
// special tokens are too. Byte sequences that are not valid UTF-8 become
// U+FFFD, as in Hugging Face tokenizers.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var out string
	if t.byteLevelDec {
		var b []byte
		for _, id := range ids {
			s, ok := t.idToken(id)
			if !ok || skipSpecial && t.added.special[s] {
				continue
			}
			b = tokenBytes(b, s)
		}
		o, _ := appendLossy(make([]byte, 0, len(b)), b, true)
		out = string(o)
	} else {
		toks := make([]string, 0, len(ids))
		for _, id := range ids {
			s, ok := t.idToken(id)
			if !ok || skipSpecial && t.added.special[s] {
				continue
			}
			toks = append(toks, s)
		}
		if t.dec != nil {
			out = strings.Join(t.dec.decodeChain(toks), "")
		} else {
			out = strings.Join(toks, " ")
		}
	}
	if t.cleanUp {
		out = cleanUpSpaces(out)
	}
	return out
}

// TokenToID returns the id of a token string (an added token's content or a
// vocabulary entry, in its byte-level form for byte-level models).
func (t *Tokenizer) TokenToID(tok string) (int32, bool) {
	if id, ok := t.added.byContent[tok]; ok {
		return id, true
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// IDToToken returns the token string of id.
func (t *Tokenizer) IDToToken(id int32) (string, bool) {
	if a, ok := t.added.byID[id]; ok {
		return a.Content, true
	}
	s, ok := t.model.vocabR[id]
	return s, ok
}

// IsSpecial reports whether id is a special added token (skipped by
// Decode with skipSpecial).
func (t *Tokenizer) IsSpecial(id int32) bool {
	a, ok := t.added.byID[id]
	return ok && t.added.special[a.Content]
}

// SpecialIDs returns the ids of all special added tokens, sorted.
func (t *Tokenizer) SpecialIDs() []int32 {
	var out []int32
	for id, a := range t.added.byID {
		if t.added.special[a.Content] {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// VocabSize returns the size of the id space: the largest id plus one,
// added tokens included.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS returns the beginning-of-sequence id, if the model has one.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }

// EOS returns the end-of-sequence ids: tokenizer_config.json's eos_token
// first, then the other ids of generation_config.json's eos_token_id.
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

// IsEOS reports whether id ends generation.
func (t *Tokenizer) IsEOS(id int32) bool {
	for _, x := range t.eos {
		if x == id {
			return true
		}
	}
	return false
}

// PAD returns the padding id, if the model has one.
func (t *Tokenizer) PAD() (int32, bool) { return t.pad, t.pad >= 0 }

// ChatTemplate returns the Jinja chat template source ("" if none).
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// postProcessor adds special tokens around an encoding.
type postProcessor interface {
	process(ids []int32, addSpecial bool) []int32
}

type postSeq []postProcessor

func (p postSeq) process(ids []int32, add bool) []int32 {
	for _, x := range p {
		ids = x.process(ids, add)
	}
	return ids
}

type postNone struct{}

func (postNone) process(ids []int32, _ bool) []int32 { return ids }

// postTemplate is TemplateProcessing's single template: special tokens
// around the sequence ($A).
type postTemplate struct {
	before, after []int32
}

func (p postTemplate) process(ids []int32, add bool) []int32 {
	if !add {
		return ids
	}
	out := make([]int32, 0, len(p.before)+len(ids)+len(p.after))
	out = append(out, p.before...)
	out = append(out, ids...)
	return append(out, p.after...)
}

type postConfig struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []json.RawMessage `json:"-"`
	SingleRaw     json.RawMessage   `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

// parseSeq parses the members of a Sequence (a normalizer, pre-tokenizer,
// post-processor or decoder of type "Sequence"; key names its list in
// errors) with parse, leaving out null ones.
func parseSeq[S ~[]T, T any](key string, raws []json.RawMessage, parse func(json.RawMessage) (T, error)) (S, error) {
	var seq S
	for i, r := range raws {
		x, err := parse(r)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", key, i, err)
		}
		if any(x) != nil {
			seq = append(seq, x)
		}
	}
	return seq, nil
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c postConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return parseSeq[postSeq]("processors", c.Processors, parsePostProcessor)
	case "ByteLevel":
		return postNone{}, nil
	case "TemplateProcessing":
		var p postTemplate
		seen := false
		single := c.Single
		if len(c.SingleRaw) > 0 && c.SingleRaw[0] == '"' {
			// The string form: "[CLS]:0 $A:0 [SEP]:0".
			var str string
			if err := json.Unmarshal(c.SingleRaw, &str); err != nil {
				return nil, fmt.Errorf("TemplateProcessing single: %w", err)
			}
			single = nil
			for _, f := range strings.Fields(str) {
				name, _, _ := strings.Cut(f, ":")
				if strings.HasPrefix(name, "$") {
					single = append(single, json.RawMessage(`{"Sequence": {"id": "A"}}`))
				} else {
					single = append(single, mustJSON(map[string]any{"SpecialToken": map[string]string{"id": name}}))
				}
			}
		} else if err := json.Unmarshal(c.SingleRaw, &single); err != nil {
			return nil, fmt.Errorf("TemplateProcessing single: %w", err)
		}
		for i, r := range single {
			var piece struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(r, &piece); err != nil {
				return nil, fmt.Errorf("TemplateProcessing single[%d]: %w", i, err)
			}
			switch {
			case piece.Sequence != nil:
				if seen {
					return nil, fmt.Errorf("TemplateProcessing single: more than one sequence")
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := c.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				if seen {
					p.after = append(p.after, st.IDs...)
				} else {
					p.before = append(p.before, st.IDs...)
				}
			default:
				return nil, fmt.Errorf("TemplateProcessing single[%d]: want SpecialToken or Sequence", i)
			}
		}
		if !seen {
			return nil, fmt.Errorf("TemplateProcessing single: no sequence")
		}
		return p, nil
	case "RobertaProcessing", "BertProcessing":
		sep, err := tokenPair(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("%s sep: %w", c.Type, err)
		}
		cls, err := tokenPair(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("%s cls: %w", c.Type, err)
		}
		return postTemplate{before: []int32{cls}, after: []int32{sep}}, nil
	case "":
		return nil, fmt.Errorf("post-processor without a type")
	}
	return nil, fmt.Errorf("unsupported post-processor type %q", c.Type)
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// tokenPair reads ["token", id].
func tokenPair(raw []json.RawMessage) (int32, error) {
	if len(raw) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id int32
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, fmt.Errorf("want [token, id]: %w", err)
	}
	return id, nil
}

// StreamDecoder turns ids into text one id at a time. Every string it
// returns is valid UTF-8, and the concatenation of everything Add and Flush
// return equals Decode of all the ids.
type StreamDecoder struct {
	t       *Tokenizer
	skip    bool
	pending []byte // byte-level path: bytes of an incomplete character
	ids     []int32
	emitted int // generic path: bytes of Decode(ids) already returned
	out     string
}

// NewStreamDecoder returns a decoder for a stream of generated ids. It keeps
// special tokens, like Decode(ids, false); see SetSkipSpecial.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t}
}

// SetSkipSpecial makes the decoder drop special tokens, like
// Decode(ids, true). Call it before the first Add.
func (d *StreamDecoder) SetSkipSpecial(skip bool) { d.skip = skip }

// Add consumes one id and returns the text that became final ("" while a
// multi-byte character is incomplete).
func (d *StreamDecoder) Add(id int32) string {
	t := d.t
	if t.byteLevelDec && !t.cleanUp {
		s, ok := t.idToken(id)
		if !ok || d.skip && t.added.special[s] {
			return ""
		}
		d.pending = tokenBytes(d.pending, s)
		out, rest := appendLossy(nil, d.pending, false)
		d.pending = append(d.pending[:0], rest...)
		return string(out)
	}
	// Generic decoders: decode everything up to the trailing run of
	// <0xXX> byte tokens (which ByteFallback may still turn into U+FFFD or
	// into a character) and return the new stable tail.
	d.ids = append(d.ids, id)
	k := len(d.ids)
	for k > 0 {
		s, ok := t.idToken(d.ids[k-1])
		if _, isByte := byteFallbackValue(s); !ok || !isByte {
			break
		}
		k--
	}
	full := t.Decode(d.ids[:k], d.skip)
	if len(full) < d.emitted || full[:d.emitted] != d.out {
		return "" // earlier text changed; Flush reconciles what it can
	}
	tail := full[d.emitted:]
	tail = tail[:stableLen(tail, t.cleanUp)]
	d.out = full[:d.emitted+len(tail)]
	d.emitted += len(tail)
	return tail
}

// stableLen returns how much of a decoded tail can no longer change: it
// holds back trailing U+FFFD (an incomplete byte sequence) and, when the
// clean-up of tokenization spaces is on, a short tail after the last space.
func stableLen(s string, cleanUp bool) int {
	n := len(s)
	for strings.HasSuffix(s[:n], "\uFFFD") {
		n -= len("\uFFFD")
	}
	if cleanUp {
		if k := strings.LastIndexByte(s[:n], ' '); k >= 0 && n-k <= 4 {
			n = k
		}
	}
	return n
}

// Flush returns the text still held back (an incomplete character becomes
// U+FFFD) and resets the decoder.
func (d *StreamDecoder) Flush() string {
	t := d.t
	var s string
	if t.byteLevelDec && !t.cleanUp {
		out, _ := appendLossy(nil, d.pending, true)
		s = string(out)
	} else if len(d.ids) > 0 {
		full := t.Decode(d.ids, d.skip)
		if len(full) >= d.emitted && full[:d.emitted] == d.out {
			s = full[d.emitted:]
		}
	}
	*d = StreamDecoder{t: t, skip: d.skip}
	return s
}
