package hub

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// modelFiles are the small files of a model directory that ferrite (or
// transformers) reads besides the weights, when the repository has them.
var modelFiles = []string{
	"config.json",
	"generation_config.json",
	"tokenizer.json",
	"tokenizer_config.json",
	"tokenizer.model",
	"special_tokens_map.json",
	"added_tokens.json",
	"vocab.json",
	"merges.txt",
	"chat_template.jinja",
	"chat_template.json",
}

// indexFile lists the shards of a sharded safetensors checkpoint.
const indexFile = "model.safetensors.index.json"

// plan is what a pull fetches: the small files first, then the weights.
type plan struct {
	meta    []sibling // configuration, tokenizer, chat template, the index
	weights []sibling // safetensors (all, or those the index names) or GGUF files
	gguf    bool
}

func (p plan) files() []sibling { return append(slices.Clone(p.meta), p.weights...) }

// choose picks the files of a repository listing: for a safetensors model
// the files of modelFiles that exist and every top-level *.safetensors
// (narrowed to the index's shards once the index is read, see
// narrowToIndex); for a GGUF repository, the file or split files of quant.
func choose(repo string, sibs []sibling, quant string) (plan, error) {
	var p plan
	var safetensors, ggufs []sibling
	for _, s := range sibs {
		switch {
		case slices.Contains(modelFiles, s.Name) || s.Name == indexFile:
			p.meta = append(p.meta, s)
		case strings.Contains(s.Name, "/"):
			// Subfolders hold other formats or copies (original/, onnx/…).
		case strings.HasSuffix(s.Name, ".safetensors"):
			safetensors = append(safetensors, s)
		}
		if strings.HasSuffix(strings.ToLower(s.Name), ".gguf") {
			ggufs = append(ggufs, s)
		}
	}
	if quant != "" || (len(safetensors) == 0 && len(ggufs) > 0) {
		return chooseGGUF(repo, ggufs, quant)
	}
	if len(safetensors) == 0 {
		names := make([]string, 0, len(sibs))
		for _, s := range sibs {
			names = append(names, s.Name)
		}
		return plan{}, fmt.Errorf("%s has no .safetensors or .gguf weights (files: %s): %w", repo, strings.Join(names, ", "), ErrNoModel)
	}
	if !slices.ContainsFunc(p.meta, func(s sibling) bool { return s.Name == "config.json" }) {
		return plan{}, fmt.Errorf("%s has no config.json, so it is not a transformers model: %w", repo, ErrNoModel)
	}
	p.weights = safetensors
	return p, nil
}

// narrowToIndex keeps the weights the index's weight_map names (a
// repository may also hold a consolidated copy of the same weights); the
// shards must all be in the listing.
func (p *plan) narrowToIndex(repo string, shards []string) error {
	var out []sibling
	for _, name := range shards {
		i := slices.IndexFunc(p.weights, func(s sibling) bool { return s.Name == name })
		if i < 0 {
			return fmt.Errorf("%s: %s names the shard %s, which the repository does not have", repo, indexFile, name)
		}
		out = append(out, p.weights[i])
	}
	p.weights = out
	return nil
}

// splitPart matches the parts of a split GGUF file: NAME-00001-of-00003.gguf.
var splitPart = regexp.MustCompile(`-(\d{5})-of-(\d{5})\.gguf$`)

// chooseGGUF picks the GGUF file of quant, or the parts of its split file,
// among files (multimodal projectors left out).
func chooseGGUF(repo string, files []sibling, quant string) (plan, error) {
	var weights []sibling
	quants := map[string]bool{}
	for _, s := range files {
		base := path.Base(s.Name)
		if strings.HasPrefix(strings.ToLower(base), "mmproj") {
			continue
		}
		if q := ggufQuant(s.Name); q != "" {
			quants[q] = true
		}
		if quant != "" && hasToken(s.Name, quant) {
			weights = append(weights, s)
		}
	}
	available := slices.Sorted(func(yield func(string) bool) {
		for q := range quants {
			if !yield(q) {
				return
			}
		}
	})
	list := strings.Join(available, ", ")
	if list == "" {
		list = "none found"
	}
	switch {
	case len(files) == 0:
		return plan{}, fmt.Errorf("%s has no .gguf files, so %q picks nothing (pull it without :%s for its safetensors): %w", repo, quant, quant, ErrNoModel)
	case quant == "":
		return plan{}, fmt.Errorf("%s is a GGUF repository: name a quantization, e.g. %s:%s (available: %s)", repo, repo, firstOr(available, "Q4_K_M"), list)
	case len(weights) == 0:
		return plan{}, fmt.Errorf("%s has no GGUF file of quantization %s (available: %s): %w", repo, quant, list, ErrNoModel)
	}
	// One file, or the parts of one split file.
	if len(weights) > 1 {
		stem := splitPart.ReplaceAllString(weights[0].Name, "")
		for _, s := range weights {
			if !splitPart.MatchString(s.Name) || splitPart.ReplaceAllString(s.Name, "") != stem {
				names := make([]string, len(weights))
				for i, w := range weights {
					names[i] = w.Name
				}
				return plan{}, fmt.Errorf("%s: %s matches several GGUF files (%s); name one more exactly", repo, quant, strings.Join(names, ", "))
			}
		}
		m := splitPart.FindStringSubmatch(weights[0].Name)
		if want := strings.TrimLeft(m[2], "0"); want != fmt.Sprint(len(weights)) {
			return plan{}, fmt.Errorf("%s: %s is split in %s parts but the repository has %d of them", repo, stem, want, len(weights))
		}
		slices.SortFunc(weights, func(a, b sibling) int { return strings.Compare(a.Name, b.Name) })
	}
	return plan{weights: weights, gguf: true}, nil
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

// hasToken says whether name holds tok (any case) bounded by characters
// that are not letters, digits or '_', so that Q4_K does not match
// Q4_K_M.
func hasToken(name, tok string) bool {
	n, t := strings.ToLower(name), strings.ToLower(tok)
	for i := 0; ; {
		j := strings.Index(n[i:], t)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(t)
		if (start == 0 || !wordByte(n[start-1])) && (end == len(n) || !wordByte(n[end])) {
			return true
		}
		i = start + 1
	}
}

func wordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z'
}

// knownQuant matches the GGUF quantization names of llama.cpp in a file
// name (for listing what a repository offers).
var knownQuant = regexp.MustCompile(`(?i)(?:^|[^a-z0-9_])((?:UD-)?(?:I?Q[1-8](?:_[0-9A-Z]+)*|BF16|F16|F32|MXFP4(?:_MOE)?|TQ[12]_0))(?:[^a-z0-9_]|$)`)

// ggufQuant is the quantization a GGUF file name carries, upper-cased; ""
// when none is recognised.
func ggufQuant(name string) string {
	base := splitPart.ReplaceAllString(path.Base(name), ".gguf")
	if m := knownQuant.FindStringSubmatch(strings.TrimSuffix(base, ".gguf")); m != nil {
		return strings.ToUpper(m[1])
	}
	return ""
}
