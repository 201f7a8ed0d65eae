package tokenizer

import (
	"io/fs"
	"path"
)

// LoadFS is Load for a directory dir of a file system, for example the
// files of a model embedded in the binary with go:embed (dir "." for the
// root). It reads the same files as Load: tokenizer.json (or
// tokenizer.json.gz), and when present tokenizer_config.json,
// chat_template.jinja and generation_config.json.
func LoadFS(fsys fs.FS, dir string) (*Tokenizer, error) {
	name := func(f string) string {
		if dir == "" || dir == "." {
			return f
		}
		return path.Join(dir, f)
	}
	return loadFiles(dir, func(f string) ([]byte, error) { return fs.ReadFile(fsys, name(f)) }, name)
}
