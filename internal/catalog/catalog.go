// Package catalog finds the models ferrite can open: the models built into
// the binary, the directories the configuration names, the Hugging Face
// cache, and ferrite's own model folder. /models lists them; /model and
// --model take their names.
//
// A model on disk is a directory with a config.json and at least one
// .safetensors file (the tokenizer files are checked when it loads). The
// places, in the order they are listed:
//
//   - built-in models: entries the program passes in (Options.Builtin),
//     loaded by their Open function;
//   - Options.Dirs (config.toml's model_dirs): each is a model directory
//     or a folder whose subdirectories are model directories;
//   - the Hugging Face cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
//     $XDG_CACHE_HOME/huggingface/hub (~/.cache/huggingface/hub), with
//     one entry per models--org--name folder: the snapshot refs/main
//     points to, else the newest one that holds a model; named "org/name";
//   - ferrite's folder: $XDG_DATA_HOME/ferrite/models/* (ModelsDir).
//
// Discovery only reads directories, config.json and file sizes: it is
// cheap enough to run whenever the list is shown.
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
	Arch   string   // config.json's model_type; "" when unknown
	Dir    string   // the model directory; "" for a model Open loads
	Size   int64    // bytes on disk (every file of the directory); 0 when unknown
	Source string   // one of the Source constants
	Open   OpenFunc // loads a model without Dir (built-in models); nil for directories
	// Problem says why the directory may not load (no safetensors, an
	// unreadable config.json); "" when it looks complete.
	Problem string
}

// Options say where Discover looks.
type Options struct {
	Builtin []Entry  // listed first, as they are
	Dirs    []string // config.toml's model_dirs ("~/" is the home directory)
	// HubDir is the Hugging Face hub cache; "" means HubCacheDir().
	HubDir string
	// FerriteDir is ferrite's model folder; "" means ModelsDir().
	FerriteDir string
}

// HubCacheDir is the Hugging Face hub cache: $HF_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub.
func HubCacheDir() string {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return expandHome(d)
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(expandHome(d), "hub")
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
	for _, d := range opts.Dirs {
		es, err := scanFolder(expandHome(d), SourceConfig, true)
		if err != nil {
			errs = append(errs, err)
		}
		for _, e := range es {
			add(e)
		}
	}
	hub := opts.HubDir
	if hub == "" {
		hub = HubCacheDir()
	}
	es, err := scanHub(hub)
	if err != nil {
		errs = append(errs, err)
	}
	for _, e := range es {
		add(e)
	}
	fd := opts.FerriteDir
	if fd == "" {
		fd = ModelsDir()
	}
	es, err = scanFolder(fd, SourceFerrite, false)
	if err != nil {
		errs = append(errs, err)
	}
	for _, e := range es {
		add(e)
	}
	return out, errs
}

// Probe describes the model directory dir (Source SourcePath). It fails
// when dir is not a directory with a config.json.
func Probe(dir string) (Entry, error) {
	dir = expandHome(dir)
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
	if !st.IsDir() {
		return Entry{}, fmt.Errorf("%s is not a directory", dir)
	}
	if !exists(filepath.Join(dir, "config.json")) {
		return Entry{}, fmt.Errorf("%s has no config.json: not a model directory", dir)
	}
	return describe(dir, filepath.Base(dir), SourcePath), nil
}

// scanFolder lists dir itself when it is a model directory (and self is
// set), else its subdirectories that are. A dir that does not exist gives
// nothing.
func scanFolder(dir, source string, self bool) ([]Entry, error) {
	if self && exists(filepath.Join(dir, "config.json")) {
		return []Entry{describe(dir, filepath.Base(filepath.Clean(dir)), source)}, nil
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("model folder: %w", err)
	}
	var out []Entry
	for _, e := range ents {
		sub := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".") || !isDir(sub) || !exists(filepath.Join(sub, "config.json")) {
			continue
		}
		out = append(out, describe(sub, e.Name(), source))
	}
	return out, nil
}

// scanHub lists the models of a Hugging Face hub cache: for each
// models--org--name, the snapshot that refs/main names, else the most
// recently modified snapshot holding a config.json.
func scanHub(hub string) ([]Entry, error) {
	ents, err := os.ReadDir(hub)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("Hugging Face cache: %w", err)
	}
	var out []Entry
	for _, e := range ents {
		repo, ok := strings.CutPrefix(e.Name(), "models--")
		if !ok || !e.IsDir() {
			continue
		}
		name := strings.ReplaceAll(repo, "--", "/")
		base := filepath.Join(hub, e.Name())
		if snap := hubSnapshot(base); snap != "" {
			out = append(out, describe(snap, name, SourceHFCache))
		}
	}
	return out, nil
}

// hubSnapshot picks the snapshot directory of one cached repository.
func hubSnapshot(repo string) string {
	snaps := filepath.Join(repo, "snapshots")
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", "main")); err == nil {
		d := filepath.Join(snaps, strings.TrimSpace(string(ref)))
		if exists(filepath.Join(d, "config.json")) {
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
		if !exists(filepath.Join(d, "config.json")) {
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
		func(e Entry) bool { return e.Name == name },
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
// directory.
func Load(e Entry, opts engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
	if e.Open != nil {
		return e.Open(opts)
	}
	if e.Dir == "" {
		return nil, nil, fmt.Errorf("model %s has neither a directory nor a loader", e.Name)
	}
	tok, err := tokenizer.Load(e.Dir)
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

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
