// Package catalog finds the models ferrite can open: the models built into
// the binary, the directories the configuration names, the Hugging Face
// cache, ferrite's own model folder, and the GGUF models of other tools
// (ollama, LM Studio), used in place: never copied or written. /models
// lists them; /model and --model take their names.
//
// A model on disk is a directory with a config.json and at least one
// .safetensors file (the tokenizer files are checked when it loads), or a
// GGUF file (package engine/gguf; a split model by its first part). The
// places, in the order they are listed:
//
//   - built-in models: entries the program passes in (Options.Builtin),
//     loaded by their Open function;
//   - Options.Dirs (config.toml's model_dirs): each is a model directory,
//     a GGUF file, or a folder of model directories, GGUF files and
//     folders holding GGUF files;
//   - the Hugging Face cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
//     $XDG_CACHE_HOME/huggingface/hub (~/.cache/huggingface/hub), with
//     one entry per models--org--name folder: the snapshot refs/main
//     points to, else the newest one that holds a model; named "org/name",
//     and "org/name/FILE" for each GGUF file of the snapshot;
//   - ferrite's folder: $XDG_DATA_HOME/ferrite/models/* (ModelsDir);
//   - ollama's store ($OLLAMA_MODELS, else ~/.ollama/models): each
//     manifest's GGUF model blob, named as ollama names it ("llama3.2:3b");
//   - LM Studio's folder (~/.lmstudio/models/PUBLISHER/REPO/*.gguf),
//     named "PUBLISHER/REPO/FILE".
//
// Discovery only reads directories, config.json, ollama manifests, GGUF
// headers and file sizes: it is cheap enough to run whenever the list is
// shown. A model ferrite cannot run (an unsupported architecture or
// tokenizer, a vision projector, ollama's non-GGUF formats) is listed with
// the reason in Entry.Problem.
package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/internal/units"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Where an Entry was found.
const (
	SourceBuiltin = "built-in"
	SourceConfig  = "config"   // config.toml's model_dirs
	SourceHFCache = "hf-cache" // the Hugging Face cache
	SourceFerrite = "ferrite"  // $XDG_DATA_HOME/ferrite/models
	SourcePath    = "path"     // a directory given on the command line or to /model
)

// OpenFunc loads a model that has no directory (a built-in one) with its
// tokenizer.
type OpenFunc func(engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error)

// Entry is one model.
type Entry struct {
	Name   string   // what /model and --model take: "org/name" in the HF cache, the folder's name elsewhere
	Arch   string   // config.json's model_type, or a GGUF file's general.architecture; "" when unknown
	Dir    string   // the model directory or GGUF file; "" for a model Open loads
	Quant  string   // a GGUF file's quantization ("Q4_K_M", "Q8_0", "BF16"); "" for safetensors
	Size   int64    // bytes on disk (every file of the directory); 0 when unknown
	Source string   // one of the Source constants
	Open   OpenFunc // loads a model without Dir (built-in models); nil for directories
	// Problem says why the directory may not load (no safetensors, an
	// unreadable config.json); "" when it looks complete.
	Problem string
	// Sampling is what the store recommends beside the model's own files
	// (ollama's params layer); it wins over the tokenizer's (Recommended).
	Sampling tokenizer.Sampling
}

// Recommended is the sampling to recommend for e's model, whose tokenizer
// is tok: the store's values where it has them, else the model files'.
func (e Entry) Recommended(tok *tokenizer.Tokenizer) tokenizer.Sampling {
	s := tok.Sampling()
	if e.Sampling.Temperature != nil {
		s.Temperature = e.Sampling.Temperature
	}
	if e.Sampling.TopP != nil {
		s.TopP = e.Sampling.TopP
	}
	if e.Sampling.TopK != nil {
		s.TopK = e.Sampling.TopK
	}
	return s
}

// Options say where Discover looks.
type Options struct {
	Builtin []Entry  // listed first, as they are
	Dirs    []string // config.toml's model_dirs ("~/" is the home directory)
	// HubDir is the Hugging Face hub cache; "" means HubCacheDir().
	HubDir string
	// FerriteDir is ferrite's model folder; "" means ModelsDir().
	FerriteDir string
	// OllamaDir is ollama's store; "" means OllamaModelsDir().
	OllamaDir string
	// LMStudioDir is LM Studio's models folder; "" means LMStudioModelsDir().
	LMStudioDir string
}

// HubCacheDir is the Hugging Face hub cache: $HF_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub.
func HubCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return units.ExpandHome(d)
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(units.ExpandHome(d), "hub")
	}
	return filepath.Join(xdg.CacheHome, "huggingface", "hub")
}

// ModelsDir is ferrite's own model folder, $XDG_DATA_HOME/ferrite/models.
func ModelsDir() string {
	return filepath.Join(xdg.DataHome, "ferrite", "models")
}

// Discover lists the models of every place, in the order of the package
// comment, each directory once. Places that do not exist are skipped; the
// errors are those of places that exist but cannot be read (the entries
// found elsewhere are still returned).
func Discover(opts Options) ([]Entry, []error) {
	var out []Entry
	var errs []error
	seen := map[string]bool{}
	add := func(e Entry) {
		if e.Dir != "" {
			key := e.Dir
			if r, err := filepath.EvalSymlinks(e.Dir); err == nil {
				key = r
			}
			if seen[key] {
				return
			}
			seen[key] = true
		}
		out = append(out, e)
	}
	for _, e := range opts.Builtin {
		if e.Source == "" {
			e.Source = SourceBuiltin
		}
		add(e)
	}
	// scanned adds a place's entries and records its error.
	scanned := func(es []Entry, err error) {
		if err != nil {
			errs = append(errs, err)
		}
		for _, e := range es {
			add(e)
		}
	}
	// place scans dir, or def's folder when dir is unset.
	place := func(dir string, def func() string, scan func(string) ([]Entry, error)) {
		if dir == "" {
			dir = def()
		}
		scanned(scan(dir))
	}
	for _, d := range opts.Dirs {
		scanned(scanFolder(units.ExpandHome(d), SourceConfig, true))
	}
	place(opts.HubDir, HubCacheDir, scanHub)
	place(opts.FerriteDir, ModelsDir, func(dir string) ([]Entry, error) { return scanFolder(dir, SourceFerrite, false) })
	place(opts.OllamaDir, OllamaModelsDir, scanOllama)
	place(opts.LMStudioDir, LMStudioModelsDir, scanLMStudio)
	return out, errs
}

// Probe describes the model directory or GGUF file dir (Source
// SourcePath). It fails when dir is neither a directory with a config.json
// nor a GGUF file or a directory holding one GGUF model.
func Probe(dir string) (Entry, error) {
	dir = units.ExpandHome(dir)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	st, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, fmt.Errorf("%s: no such model directory", dir)
	}
	if err != nil {
		return Entry{}, err
	}
	if st.IsDir() && exists(filepath.Join(dir, "config.json")) {
		return describe(dir, filepath.Base(dir), SourcePath), nil
	}
	file, ok, err := gguf.Find(dir)
	switch {
	case err != nil:
		return Entry{}, err
	case ok:
		return describeGGUF(file, ggufName("", file), SourcePath), nil
	case !st.IsDir():
		return Entry{}, fmt.Errorf("%s is neither a model directory nor a GGUF file", dir)
	}
	return Entry{}, fmt.Errorf("%s has no config.json and no .gguf file: not a model directory", dir)
}

// scanFolder lists dir itself when it is a model directory or a GGUF file
// (and self is set), else its subdirectories that are model directories,
// its GGUF files and those of its subdirectories without a config.json. A
// dir that does not exist gives nothing.
func scanFolder(dir, source string, self bool) ([]Entry, error) {
	if self && exists(filepath.Join(dir, "config.json")) {
		return []Entry{describe(dir, filepath.Base(filepath.Clean(dir)), source)}, nil
	}
	if self && gguf.IsGGUF(dir) {
		return []Entry{describeGGUF(dir, ggufName("", dir), source)}, nil
	}
	ents, err := readPlace(dir, "model folder")
	if err != nil {
		return nil, err
	}
	out := scanGGUFDir(dir, "", source)
	for _, e := range ents {
		sub := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".") || !isDir(sub) {
			continue
		}
		if exists(filepath.Join(sub, "config.json")) {
			out = append(out, describe(sub, e.Name(), source))
		} else {
			out = append(out, scanGGUFDir(sub, e.Name()+"/", source)...)
		}
	}
	return out, nil
}

// readPlace lists the folder dir of a place; one that does not exist is
// empty, not an error. what names the place in errors.
func readPlace(dir, what string) ([]os.DirEntry, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ents, nil
}

// scanHub lists the models of a Hugging Face hub cache: for each
// models--org--name, the snapshot that refs/main names, else the most
// recently modified snapshot holding a model.
func scanHub(hub string) ([]Entry, error) {
	ents, err := readPlace(hub, "Hugging Face cache")
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range ents {
		repo, ok := strings.CutPrefix(e.Name(), "models--")
		if !ok || !e.IsDir() {
			continue
		}
		name := strings.ReplaceAll(repo, "--", "/")
		base := filepath.Join(hub, e.Name())
		snap := hubSnapshot(base)
		if snap == "" {
			continue
		}
		if exists(filepath.Join(snap, "config.json")) {
			out = append(out, describe(snap, name, SourceHFCache))
		}
		// GGUF files (what llama-cli -hf downloads), also in subfolders
		// such as Q4_K_M/ of repositories that split files by quantization.
		out = append(out, scanGGUFDir(snap, name+"/", SourceHFCache)...)
		subs, _ := os.ReadDir(snap)
		for _, s := range subs {
			if p := filepath.Join(snap, s.Name()); !strings.HasPrefix(s.Name(), ".") && isDir(p) {
				out = append(out, scanGGUFDir(p, name+"/"+s.Name()+"/", SourceHFCache)...)
			}
		}
	}
	return out, nil
}

// hubSnapshot picks the snapshot directory of one cached repository.
func hubSnapshot(repo string) string {
	snaps := filepath.Join(repo, "snapshots")
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err == nil {
		d := filepath.Join(snaps, strings.TrimSpace(string(ref)))
		if holdsModel(d) {
			return d
		}
	}
	ents, err := os.ReadDir(snaps)
	if err != nil {
		return ""
	}
	best, bestTime := "", int64(0)
	for _, e := range ents {
		d := filepath.Join(snaps, e.Name())
		if !holdsModel(d) {
			continue
		}
		info, err := os.Stat(d)
		if err != nil {
			continue
		}
		if t := info.ModTime().UnixNano(); best == "" || t > bestTime {
			best, bestTime = d, t
		}
	}
	return best
}

// holdsModel reports whether a snapshot has a config.json or GGUF files
// (in it or one level down).
func holdsModel(d string) bool {
	if exists(filepath.Join(d, "config.json")) || len(gguf.ModelFiles(d)) > 0 {
		return true
	}
	subs, _ := os.ReadDir(d)
	for _, s := range subs {
		if len(gguf.ModelFiles(filepath.Join(d, s.Name()))) > 0 {
			return true
		}
	}
	return false
}

// describe reads what an entry shows from its directory.
func describe(dir, name, source string) Entry {
	e := Entry{Name: name, Dir: dir, Source: source}
	arch, err := readArch(filepath.Join(dir, "config.json"))
	if err != nil {
		e.Problem = err.Error()
	}
	e.Arch = arch
	var weights bool
	e.Size, weights = dirSize(dir)
	if !weights && e.Problem == "" {
		e.Problem = "no .safetensors weights"
	}
	return e
}

// readArch is config.json's model_type (or its text_config's, for
// multimodal configs).
func readArch(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var c struct {
		ModelType     string   `json:"model_type"`
		Architectures []string `json:"architectures"`
		TextConfig    *struct {
			ModelType string `json:"model_type"`
		} `json:"text_config"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return "", fmt.Errorf("config.json: %w", err)
	}
	switch {
	case c.ModelType != "":
		return c.ModelType, nil
	case c.TextConfig != nil && c.TextConfig.ModelType != "":
		return c.TextConfig.ModelType, nil
	case len(c.Architectures) > 0:
		return c.Architectures[0], nil
	}
	return "", nil
}

// dirSize adds up the sizes of dir's files (following the symbolic links
// of the HF cache to their blobs, two levels deep at most), and says
// whether a .safetensors file is among them.
func dirSize(dir string) (size int64, weights bool) {
	var walk func(d string, depth int)
	walk = func(d string, depth int) {
		ents, err := os.ReadDir(d)
		if err != nil {
			return
		}
		for _, e := range ents {
			p := filepath.Join(d, e.Name())
			info, err := os.Stat(p) // follows links
			if err != nil {
				continue
			}
			if info.IsDir() {
				if depth < 2 && !strings.HasPrefix(e.Name(), ".") {
					walk(p, depth+1)
				}
				continue
			}
			size += info.Size()
			if strings.HasSuffix(e.Name(), ".safetensors") {
				weights = true
			}
		}
	}
	walk(dir, 0)
	return size, weights
}

// Find picks the entry name refers to: an exact name, then a name that
// differs only in case, then the part after the last "/" of a name
// ("Qwen3-0.6B" for "Qwen/Qwen3-0.6B"), then the 1-based position in
// the list ("2"), then a unique substring. It fails with the candidates
// when more than one entry matches, and with a suggestion when none does.
func Find(entries []Entry, name string) (Entry, error) {
	name = strings.TrimSpace(name)
	match := func(ok func(Entry) bool) []Entry {
		var out []Entry
		for _, e := range entries {
			if ok(e) {
				out = append(out, e)
			}
		}
		return out
	}
	lower := strings.ToLower(name)
	for _, rule := range []func(Entry) bool{
		func(e Entry) bool { return e.Name == name || e.Name == name+":latest" }, // ollama's default tag
		func(e Entry) bool { return strings.ToLower(e.Name) == lower },
		func(e Entry) bool { return strings.ToLower(e.Name[strings.LastIndexByte(e.Name, '/')+1:]) == lower },
		nil, // the position in the list
		func(e Entry) bool { return name != "" && strings.Contains(strings.ToLower(e.Name), lower) },
	} {
		if rule == nil {
			if n, err := strconv.Atoi(name); err == nil && n >= 1 && n <= len(entries) {
				return entries[n-1], nil
			}
			continue
		}
		switch m := match(rule); len(m) {
		case 0:
		case 1:
			return m[0], nil
		default:
			names := make([]string, len(m))
			for i, e := range m {
				names[i] = e.Name
			}
			return Entry{}, fmt.Errorf("%q matches %d models: %s", name, len(m), strings.Join(names, ", "))
		}
	}
	if len(entries) == 0 {
		return Entry{}, fmt.Errorf("no model %q: no models were found", name)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name
	}
	slices.Sort(names)
	return Entry{}, fmt.Errorf("no model %q; known: %s", name, strings.Join(names, ", "))
}

// Load opens e: its Open function, or the tokenizer and weights of its
// directory or GGUF file.
func Load(e Entry, opts engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
	if e.Open != nil {
		return e.Open(opts)
	}
	if e.Dir == "" {
		return nil, nil, fmt.Errorf("model %s has neither a directory nor a loader", e.Name)
	}
	tok, err := engine.LoadTokenizer(e.Dir)
	if err != nil {
		return nil, nil, err
	}
	l, err := engine.Load(e.Dir, opts)
	if err != nil {
		return nil, nil, err
	}
	return l, tok, nil
}

// LooksLikePath says whether s is meant as a directory rather than a
// model's name: it starts with "/", "./", "../" or "~/" (or is "." or "..").
func LooksLikePath(s string) bool {
	return s == "." || s == ".." || filepath.IsAbs(s) ||
		strings.HasPrefix(s, "./") || strings.HasPrefix(s, "../") || strings.HasPrefix(s, "~/")
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
