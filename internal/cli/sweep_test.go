package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// The damaged-model sweep: copies of the built-in model's folder with one
// file damaged each (bytes flipped, the file cut short, a value in a JSON
// file replaced, a hostile chat template, a safetensors header edited) go
// through `ferrite run` in-process. Each must end within its deadline with
// output or a clean error: no panic (not even one Main recovers), no hang.
//
//	go test ./internal/cli -run TestDamagedModels                       # 24 cases
//	go test ./internal/cli -run TestDamagedModels -sweep.cases 2000 -sweep.seed 7 -v
var (
	sweepCases = flag.Int("sweep.cases", 24, "damaged-model sweep: number of cases")
	sweepSeed  = flag.Uint64("sweep.seed", 1, "damaged-model sweep: seed of the damage")
	sweepFirst = flag.Int("sweep.first", 0, "damaged-model sweep: first case to run (to replay one)")
)

// sweepDeadline is a case's context deadline; sweepGrace how much longer
// Main may take to return before the case counts as a hang.
const (
	sweepDeadline = 5 * time.Second
	sweepGrace    = 5 * time.Second
)

// damage is one case: the file it damages and how.
type damage struct {
	file string
	desc string
	data []byte // the damaged contents
}

func TestDamagedModels(t *testing.T) {
	if testing.Short() && *sweepCases > 24 {
		t.Skip("large sweep in -short mode")
	}
	fixture := t.TempDir()
	if err := builtin.Export(fixture); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	entries, err := os.ReadDir(fixture)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if files[e.Name()], err = os.ReadFile(filepath.Join(fixture, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	var ok, clean int
	var failures []string
	var slowest time.Duration
	slowCase := -1
	for i := *sweepFirst; i < *sweepFirst+*sweepCases; i++ {
		rng := rand.New(rand.NewPCG(*sweepSeed, uint64(i)))
		d := damageOne(rng, files)
		dir := filepath.Join(t.TempDir(), "model")
		writeCase(t, dir, fixture, files, d)
		fmt.Fprintf(os.Stderr, "sweep case %d: %s: %s\n", i, d.file, d.desc) // visible if the process dies
		start := time.Now()
		res := runCase(dir)
		if d := time.Since(start); d > slowest {
			slowest, slowCase = d, i
		}
		switch {
		case res.failure != "":
			failures = append(failures, fmt.Sprintf("case %d (%s: %s): %s", i, d.file, d.desc, res.failure))
		case res.code == 0:
			ok++
		default:
			clean++
		}
		os.RemoveAll(dir)
	}
	t.Logf("%d cases: %d generated, %d clean errors, %d failures; slowest: case %d, %v",
		*sweepCases, ok, clean, len(failures), slowCase, slowest.Round(time.Millisecond))
	for _, f := range failures {
		t.Error(f)
	}
}

type caseResult struct {
	code    int
	failure string // why the case failed, or ""
}

// runCase runs `ferrite run` on dir with a tiny generation.
func runCase(dir string) caseResult {
	ctx, cancel := context.WithTimeout(context.Background(), sweepDeadline)
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	start := time.Now()
	go func() {
		done <- Main(ctx, []string{"run", "--model", dir, "--threads", "1", "--max-tokens", "3", "--temperature", "0", "--kv-budget", "8388608", "What does ephemeral mean? Answer in one line."}, strings.NewReader(""), &stdout, &stderr)
	}()
	select {
	case code := <-done:
		msg := stderr.String()
		switch {
		case strings.Contains(msg, "internal error"), strings.Contains(msg, "panic"):
			return caseResult{code, "panicked: " + firstLine(msg)}
		case code != 0 && !strings.Contains(msg, "ferrite run: "):
			return caseResult{code, fmt.Sprintf("exit %d without an error message: %q", code, firstLine(msg))}
		case code == 0 && stdout.Len() == 0:
			return caseResult{code, "exit 0 without output"}
		}
		return caseResult{code: code}
	case <-time.After(sweepDeadline + sweepGrace):
		return caseResult{-1, fmt.Sprintf("still running after %v", time.Since(start).Round(time.Second))}
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// writeCase makes dir a copy of the fixture with d's file damaged (the other
// files hard-linked, or copied where links fail).
func writeCase(t *testing.T, dir, fixture string, files map[string][]byte, d damage) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		dst := filepath.Join(dir, name)
		if name == d.file {
			if d.data != nil {
				if err := os.WriteFile(dst, d.data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		if os.Link(filepath.Join(fixture, name), dst) != nil {
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// damageOne picks a file and damages a copy of it.
func damageOne(rng *rand.Rand, files map[string][]byte) damage {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	// Weighted: the files with the most structure get the most cases.
	pick := []string{"config.json", "config.json", "config.json", "model.safetensors", "model.safetensors",
		"tokenizer.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.jinja", "generation_config.json"}
	name := pick[rng.IntN(len(pick))]
	if _, ok := files[name]; !ok {
		name = names[rng.IntN(len(names))]
	}
	orig := files[name]
	switch name {
	case "model.safetensors":
		return damageSafetensors(rng, orig)
	case "tokenizer.json":
		if rng.IntN(8) == 0 {
			// A regex that backtracks for ever on the rendered prompt.
			pre := `"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(([^#]+)+)+#"},"behavior":"Isolated","invert":false}`
			out := regexp.MustCompile(`"pre_tokenizer": *\{[^}]*\}`).ReplaceAllLiteral(orig, []byte(pre))
			return damage{name, "backtracking pre-tokenizer regex", out}
		}
	case "chat_template.jinja":
		if rng.IntN(2) == 0 {
			h := fixtures.HostileTemplates[rng.IntN(len(fixtures.HostileTemplates))]
			return damage{name, "hostile template: " + h.Name, []byte(h.Src)}
		}
	}
	if strings.HasSuffix(name, ".json") && rng.IntN(3) > 0 {
		if d, ok := replaceJSONValue(rng, name, orig); ok {
			return d
		}
	}
	return damageBytes(rng, name, orig, 0, len(orig))
}

// damageBytes flips bytes in data[lo:hi], cuts the file, deletes it or
// empties it.
func damageBytes(rng *rand.Rand, name string, orig []byte, lo, hi int) damage {
	data := slices.Clone(orig)
	switch k := rng.IntN(10); {
	case k < 6 && hi > lo:
		n := 1 + rng.IntN(8)
		for range n {
			data[lo+rng.IntN(hi-lo)] ^= byte(1 + rng.IntN(255))
		}
		return damage{name, fmt.Sprintf("%d bytes flipped in [%d, %d)", n, lo, hi), data}
	case k < 8:
		cut := rng.IntN(len(data) + 1)
		return damage{name, fmt.Sprintf("cut to %d bytes", cut), data[:cut]}
	case k < 9:
		return damage{name, "empty", []byte{}}
	}
	return damage{name, "missing", nil}
}

// oddValues replace JSON values: out-of-range numbers, wrong types.
var oddValues = []any{
	0, -1, 1, 3, 1e12, 1 << 31, 1 << 40, -1e12, 1e300, 0.5, -0.0, "x", "", nil, true, false,
	[]any{}, []any{1e12}, map[string]any{}, 65536, 1e6, 4096, 1e9,
}

// replaceJSONValue sets one value of the JSON file (a random scalar, at any
// depth) to one of oddValues, or deletes its key.
func replaceJSONValue(rng *rand.Rand, name string, orig []byte) (damage, bool) {
	dec := json.NewDecoder(bytes.NewReader(orig))
	dec.UseNumber()
	var root any
	if dec.Decode(&root) != nil {
		return damage{}, false
	}
	var paths [][]any // paths to scalars and containers
	var walk func(v any, path []any)
	walk = func(v any, path []any) {
		if len(path) > 0 {
			paths = append(paths, slices.Clone(path))
		}
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(e, append(path, k))
			}
		case []any:
			for i, e := range v {
				if i < 64 || rng.IntN(len(v)) < 64 { // big arrays: a sample
					walk(e, append(path, i))
				}
			}
		}
	}
	walk(root, nil)
	if len(paths) == 0 {
		return damage{}, false
	}
	slices.SortFunc(paths, func(a, b []any) int { return strings.Compare(fmt.Sprint(a...), fmt.Sprint(b...)) })
	path := paths[rng.IntN(len(paths))]
	parent := root
	for _, p := range path[:len(path)-1] {
		switch c := parent.(type) {
		case map[string]any:
			parent = c[p.(string)]
		case []any:
			parent = c[p.(int)]
		}
	}
	last := path[len(path)-1]
	val := oddValues[rng.IntN(len(oddValues))]
	var cur any
	switch c := parent.(type) {
	case map[string]any:
		cur = c[last.(string)]
	case []any:
		cur = c[last.(int)]
	}
	if n, ok := cur.(json.Number); ok && rng.IntN(2) == 0 {
		// A plausible value: it gets past the bounds, to the tensor shapes.
		f, _ := n.Float64()
		val = []float64{f * 2, f / 2, f + 1, f - 1, f * 4, f + 64}[rng.IntN(6)]
	}
	desc := fmt.Sprintf("%v = %v", path, val)
	switch c := parent.(type) {
	case map[string]any:
		if rng.IntN(6) == 0 {
			delete(c, last.(string))
			desc = fmt.Sprintf("%v deleted", path)
		} else {
			c[last.(string)] = val
		}
	case []any:
		c[last.(int)] = val
	}
	out, err := json.Marshal(root)
	if err != nil {
		return damage{}, false
	}
	return damage{name, desc, out}, true
}

// damageSafetensors edits the header (a value replaced, bytes flipped, the
// header length changed) or the data (bytes flipped, the file cut).
func damageSafetensors(rng *rand.Rand, orig []byte) damage {
	const name = "model.safetensors"
	if len(orig) < 8 {
		return damageBytes(rng, name, orig, 0, len(orig))
	}
	hlen := int(binary.LittleEndian.Uint64(orig))
	if hlen > len(orig)-8 {
		return damageBytes(rng, name, orig, 0, len(orig))
	}
	switch rng.IntN(5) {
	case 0, 1:
		d, ok := replaceJSONValue(rng, name, orig[8:8+hlen])
		if !ok {
			break
		}
		// Keep the data where it was: pad the new header to its old size, or
		// give it its own length when it grew.
		hdr := d.data
		if len(hdr) <= hlen {
			hdr = append(hdr, bytes.Repeat([]byte{' '}, hlen-len(hdr))...)
		}
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		out = append(append(out, hdr...), orig[8+hlen:]...)
		return damage{name, "header " + d.desc, out}
	case 2:
		out := slices.Clone(orig)
		v := []uint64{0, 1, uint64(hlen) - 1, uint64(hlen) + 1, uint64(len(orig)), 1 << 40, 1<<64 - 1}[rng.IntN(7)]
		binary.LittleEndian.PutUint64(out, v)
		return damage{name, fmt.Sprintf("header length %d", v), out}
	case 3:
		return damageBytes(rng, name, orig, 8, 8+hlen)
	}
	return damageBytes(rng, name, orig, 8+hlen, len(orig))
}
