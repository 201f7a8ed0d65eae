package tokenizer

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"unicode/utf8"
)

// LoadFS is Load for a directory dir of a file system, for example the
// files of a model embedded in the binary with go:embed (dir "." for the
// root). It reads the same files as Load: tokenizer.json (or
// tokenizer.json.gz), and when present tokenizer_config.json,
// chat_template.jinja and generation_config.json.
func LoadFS(fsys fs.FS, dir string) (tok *Tokenizer, err error) {
	name := func(f string) string {
		if dir == "" || dir == "." {
			return f
		}
		return path.Join(dir, f)
	}
	defer func() {
		if r := recover(); r != nil {
			tok, err = nil, fmt.Errorf("tokenizer: %s: malformed tokenizer (internal error: %v)", dir, r)
		}
	}()
	tjPath := name("tokenizer.json")
	data, err := fs.ReadFile(fsys, tjPath)
	if errors.Is(err, fs.ErrNotExist) {
		gzPath := tjPath + ".gz"
		var gz []byte
		if gz, err = fs.ReadFile(fsys, gzPath); err == nil {
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
	optional := func(p string) ([]byte, error) {
		b, err := fs.ReadFile(fsys, p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", p, err)
		}
		return b, nil
	}
	cfgPath, genPath, jinjaPath := name("tokenizer_config.json"), name("generation_config.json"), name("chat_template.jinja")
	cfg, err := optional(cfgPath)
	if err != nil {
		return nil, err
	}
	gen, err := optional(genPath)
	if err != nil {
		return nil, err
	}
	jinja, err := optional(jinjaPath)
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
