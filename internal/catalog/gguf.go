package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/internal/units"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Where the models of other tools are found.
const (
	SourceOllama   = "ollama"    // ollama's store
	SourceLMStudio = "lm-studio" // LM Studio's models folder
)

// OllamaModelsDir is ollama's store: $OLLAMA_MODELS, else ~/.ollama/models.
func OllamaModelsDir() string {
	if d := os.Getenv("OLLAMA_MODELS"); d != "" {
		return units.ExpandHome(d)
	}
	return units.ExpandHome("~/.ollama/models")
}

// LMStudioModelsDir is LM Studio's models folder: ~/.lmstudio/models, or
// ~/.cache/lm-studio/models where only that older one exists.
func LMStudioModelsDir() string {
	dir := units.ExpandHome("~/.lmstudio/models")
	if old := units.ExpandHome("~/.cache/lm-studio/models"); !exists(dir) && exists(old) {
		return old
	}
	return dir
}

// describeGGUF reads what an entry shows from a GGUF file (the first part
// of a split model): its architecture, quantization and size, and the
// reason ferrite cannot run it, if any. The file is mapped and its header
// validated, but no tensor data is read.
func describeGGUF(path, name, source string) Entry {
	e := Entry{Name: name, Dir: path, Source: source}
	if fi, err := os.Stat(path); err == nil {
		e.Size = fi.Size()
	}
	m, err := gguf.Open(path)
	if err != nil {
		e.Problem = err.Error()
		return e
	}
	defer m.Close()
	e.Arch, e.Quant, e.Size = m.Meta.Arch(), m.Quantization(), m.Size()
	e.Problem = m.Problem()
	return e
}

// ggufName is the name of a GGUF file's entry: its base name without
// ".gguf" (and without the -00001-of-0000N of a split model), after prefix.
func ggufName(prefix, path string) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	if _, count, ok := gguf.SplitPart(path); ok {
		base = strings.TrimSuffix(base, fmt.Sprintf("-00001-of-%05d", count))
	}
	return prefix + base
}

// scanGGUFDir lists the GGUF models directly in dir, named prefix + file
// base name. Vision projectors are listed too, as models ferrite cannot run.
func scanGGUFDir(dir, prefix, source string) []Entry {
	var out []Entry
	for _, p := range gguf.ModelFiles(dir) {
		out = append(out, describeGGUF(p, ggufName(prefix, p), source))
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if n := e.Name(); gguf.IsProjector(n) && strings.HasSuffix(strings.ToLower(n), ".gguf") {
			p := filepath.Join(dir, n)
			out = append(out, Entry{Name: ggufName(prefix, p), Dir: p, Source: source, Size: fileSize(p),
				Arch: "clip", Problem: "a vision projector (mmproj), not a language model"})
		}
	}
	return out
}

func fileSize(p string) int64 {
	if fi, err := os.Stat(p); err == nil {
		return fi.Size()
	}
	return 0
}

// scanLMStudio lists LM Studio's models: <dir>/<publisher>/<repo>/*.gguf,
// named publisher/repo/file.
func scanLMStudio(dir string) ([]Entry, error) {
	pubs, err := readPlace(dir, "LM Studio models")
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, pub := range pubs {
		if !pub.IsDir() || strings.HasPrefix(pub.Name(), ".") {
			continue
		}
		repos, _ := os.ReadDir(filepath.Join(dir, pub.Name()))
		for _, repo := range repos {
			rd := filepath.Join(dir, pub.Name(), repo.Name())
			if strings.HasPrefix(repo.Name(), ".") || !isDir(rd) {
				continue
			}
			out = append(out, scanGGUFDir(rd, pub.Name()+"/"+repo.Name()+"/", SourceLMStudio)...)
		}
	}
	return out, nil
}

// ollama's manifest layer media types.
const (
	ollamaModelLayer  = "application/vnd.ollama.image.model"
	ollamaTensorLayer = "application/vnd.ollama.image.tensor"
	ollamaParamsLayer = "application/vnd.ollama.image.params"
	ollamaRegistry    = "registry.ollama.ai"
)

// ollamaManifest is the part of an ollama manifest ferrite reads.
type ollamaManifest struct {
	Layers []struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	} `json:"layers"`
}

// scanOllama lists ollama's models: each manifest
// manifests/<host>/<namespace>/<model>/<tag> names its model layer, a blob
// blobs/sha256-<hex> that is a GGUF file, used in place. Names are
// ollama's: "llama3.2:3b" for the library, "namespace/model:tag" otherwise
// (with the host when it is not ollama's registry).
func scanOllama(dir string) ([]Entry, error) {
	root := filepath.Join(dir, "manifests")
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var out []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		parts := strings.Split(filepath.ToSlash(rel), "/")
		if len(parts) != 4 {
			return nil
		}
		out = append(out, ollamaEntry(dir, p, ollamaName(parts)))
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("ollama models: %w", err)
	}
	return out, nil
}

// ollamaName is how ollama names the manifest host/namespace/model/tag.
func ollamaName(parts []string) string {
	host, ns, model, tag := parts[0], parts[1], parts[2], parts[3]
	switch {
	case host == ollamaRegistry && ns == "library":
		return model + ":" + tag
	case host == ollamaRegistry:
		return ns + "/" + model + ":" + tag
	}
	return host + "/" + ns + "/" + model + ":" + tag
}

// ollamaEntry describes the model of one manifest.
func ollamaEntry(dir, manifest, name string) Entry {
	e := Entry{Name: name, Source: SourceOllama}
	data, err := os.ReadFile(manifest)
	if err != nil {
		e.Problem = err.Error()
		return e
	}
	var m ollamaManifest
	if err := json.Unmarshal(data, &m); err != nil {
		e.Problem = fmt.Sprintf("manifest %s: %v", manifest, err)
		return e
	}
	var model, params string
	var tensors bool
	for _, l := range m.Layers {
		switch l.MediaType {
		case ollamaModelLayer:
			model = l.Digest
		case ollamaTensorLayer:
			tensors = true
		case ollamaParamsLayer:
			params = l.Digest
		}
	}
	if model == "" {
		e.Problem = "no GGUF model layer in the manifest"
		if tensors {
			e.Problem = "stored in ollama's per-tensor format, not GGUF"
		}
		return e
	}
	hex, ok := strings.CutPrefix(model, "sha256:")
	if !ok || hex == "" || strings.ContainsAny(hex, `/\.`) {
		e.Problem = fmt.Sprintf("model layer digest %q is not sha256:<hex>", model)
		return e
	}
	blob := filepath.Join(dir, "blobs", "sha256-"+hex)
	if !gguf.IsGGUF(blob) {
		e.Dir, e.Size = blob, fileSize(blob)
		e.Problem = "the model blob is missing or not a GGUF file"
		return e
	}
	e = describeGGUF(blob, name, SourceOllama) // a projector layer, if any, is not used
	e.Sampling = ollamaSampling(dir, params)
	return e
}

// ollamaSampling is the sampling of a manifest's params layer, the JSON
// ollama keeps a model's parameters in ({"temperature": 0.6, "top_k":
// 20, "top_p": 0.95, ...}); none when there is no such layer or it cannot
// be read: a recommendation never hides a model.
func ollamaSampling(dir, digest string) tokenizer.Sampling {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || hex == "" || strings.ContainsAny(hex, `/\.`) {
		return tokenizer.Sampling{}
	}
	data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256-"+hex))
	if err != nil || len(data) > 1<<20 {
		return tokenizer.Sampling{}
	}
	var p struct {
		Temperature *float64 `json:"temperature"`
		TopP        *float64 `json:"top_p"`
		TopK        *int     `json:"top_k"`
	}
	if json.Unmarshal(data, &p) != nil {
		return tokenizer.Sampling{}
	}
	return tokenizer.Sampling{Temperature: p.Temperature, TopP: p.TopP, TopK: p.TopK}
}
