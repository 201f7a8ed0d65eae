package engine

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// TestForwardSpec checks model.SpecModel.ForwardSpec against the passes it
// fuses, on the CPU: for a prompt, the MTP passes (the prompt's rows, then
// two chained drafts) and the verification of the next token with those
// drafts, run as one step, give bit for bit the drafts, logits and hidden
// states that ForwardMTP and Forward give run one after another with the
// drafts fed by the host. glm5_next is its own SpecModel, glm4_moe gqa's
// MTPDecoder.
func TestForwardSpec(t *testing.T) {
	for _, name := range []string{"glm5_next", "glm4_moe"} {
		t.Run(name, func(t *testing.T) {
			dir := fixtures.Dir(name)
			if _, err := os.Stat(dir); err != nil {
				t.Skipf("fixture %s not present", name)
			}
			l, err := Load(dir, Options{Device: "cpu", Threads: 2, KVFloat32: true})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			sm, ok := l.Model.(model.SpecModel)
			if !ok || !sm.SpecReady() {
				t.Fatalf("%s on the CPU is not a ready model.SpecModel", name)
			}
			prompt := []int32{11, 7, 200, 31, 5, 64, 9}
			twoDrafts, twoOut := specTwoStep(t, sm, prompt)
			oneDrafts, oneOut := specOneStep(t, sm, prompt)
			if !slices.Equal(oneDrafts, twoDrafts) {
				t.Fatalf("drafts: one step %v, two steps %v", oneDrafts, twoDrafts)
			}
			same := func(what string, a, b []float32) {
				if len(a) != len(b) {
					t.Fatalf("%s: %d values against %d", what, len(a), len(b))
				}
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
						t.Fatalf("%s[%d]: one step %g, two steps %g", what, i, a[i], b[i])
					}
				}
			}
			same("verification logits", oneOut.Logits, twoOut.Logits)
			same("verification hidden", oneOut.Hidden, twoOut.Hidden)
		})
	}
}

// specPrefill runs prompt on a fresh sequence, reserves room for the
// verification of the next token and two drafts, and returns the env, the
// sequence, the prompt's hidden states, its greedy next token and the MTP
// pass 0's tokens (the prompt's but the first, then the next token).
func specPrefill(t *testing.T, m model.Model, prompt []int32) (*modeltest.Env, *modeltest.Seq, []float32, int32, []int32) {
	e := modeltest.NewEnv(t, m, 4, 64, 2)
	s := e.NewSeq(t)
	out := e.Run(t, modeltest.Entry{S: s, Tokens: prompt, Logits: model.LastLogits, Hidden: true})[0]
	if err := e.Cache.Reserve(s.KV, len(prompt)+3); err != nil {
		t.Fatal(err)
	}
	next := int32(argmax(out.Logits))
	return e, s, out.Hidden, next, append(slices.Clone(prompt[1:]), next)
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// specTwoStep drafts two tokens with ForwardMTP (the host picking each
// argmax) and verifies them with Forward.
func specTwoStep(t *testing.T, m model.SpecModel, prompt []int32) ([]int32, model.SeqOutput) {
	e, s, hid, next, toks := specPrefill(t, m, prompt)
	n := len(prompt)
	b := &model.Batch{Cache: e.Cache, Seqs: []model.Seq{{Tokens: toks, Pos: 0, KV: s.KV, Logits: model.LastLogits, Hidden: true}}}
	o0, err := m.ForwardMTP(b, [][]float32{hid})
	if err != nil {
		t.Fatal(err)
	}
	d1 := int32(argmax(o0.Seqs[0].Logits))
	H := m.Info().Hidden
	b = &model.Batch{Cache: e.Cache, Seqs: []model.Seq{{Tokens: []int32{d1}, Pos: n, KV: s.KV, Logits: model.LastLogits}}}
	o1, err := m.ForwardMTP(b, [][]float32{o0.Seqs[0].Hidden[(n-1)*H:]})
	if err != nil {
		t.Fatal(err)
	}
	d2 := int32(argmax(o1.Seqs[0].Logits))
	v := &model.Batch{Cache: e.Cache, States: e.States, Seqs: []model.Seq{{Tokens: []int32{next, d1, d2}, Pos: n, KV: s.KV, State: s.Slot, Logits: model.AllLogits, Hidden: true}}}
	out, err := m.Forward(v)
	if err != nil {
		t.Fatal(err)
	}
	return []int32{d1, d2}, out.Seqs[0]
}

// specOneStep is specTwoStep as one ForwardSpec step, the drafts fed on
// the device.
func specOneStep(t *testing.T, m model.SpecModel, prompt []int32) ([]int32, model.SeqOutput) {
	e, s, hid, next, toks := specPrefill(t, m, prompt)
	n := len(prompt)
	st := &model.SpecStep{
		Drafts: []model.Batch{
			{Cache: e.Cache, Top: 1, Seqs: []model.Seq{{Tokens: toks, Pos: 0, KV: s.KV, Logits: model.LastLogits, Hidden: true}}},
			{Cache: e.Cache, Top: 1, Seqs: []model.Seq{{Tokens: []int32{0}, Pos: n, KV: s.KV, Logits: model.LastLogits}}},
		},
		Hidden: [][]float32{hid},
		Chain:  [][]int{nil, {0}},
		Verify: &model.Batch{Cache: e.Cache, States: e.States, Seqs: []model.Seq{{Tokens: []int32{next, 0, 0}, Pos: n, KV: s.KV, State: s.Slot, Logits: model.AllLogits, Hidden: true}}},
		Feed:   [][]int{{0, 0}},
	}
	drafts, out, err := m.ForwardSpec(st)
	if err != nil {
		t.Fatal(err)
	}
	var ds []int32
	for _, d := range drafts {
		ds = append(ds, d.Seqs[0].TopIDs[0])
	}
	return ds, out.Seqs[0]
}
