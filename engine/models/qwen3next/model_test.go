package qwen3next_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3next"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// fixtureTol bounds max|engine − transformers| / max|transformers|, as in
// the engine's fixture test for the other architectures.
const fixtureTol = 1e-4

// env is modeltest's Env (a cache and a state pool in the model's memory)
// bound to one test.
type env struct {
	t testing.TB
	*modeltest.Env
}

// seq is one sequence: its cache handle and state slot.
type seq = modeltest.Seq

func newEnv(t testing.TB, m model.Model) *env {
	t.Helper()
	if _, ok := m.(model.StateModel); !ok {
		t.Fatal("qwen3_next model does not implement model.StateModel")
	}
	return &env{t, modeltest.NewEnv(t, m, 8, 4096, 16)}
}

func (e *env) newSeq() *seq { return e.NewSeq(e.t) }
func (e *env) free(s *seq)  { e.Free(s) }
func (e *env) checkEmpty()  { e.CheckEmpty(e.t) }

// entry is one sequence's part of a batch for env.run.
type entry struct {
	s      *seq
	toks   []int32
	mode   model.Logits
	hidden bool
}

// run reserves and runs one batch of entries (each continuing at the end of
// its sequence).
func (e *env) run(entries ...entry) []model.SeqOutput {
	e.t.Helper()
	var es []modeltest.Entry
	for _, en := range entries {
		es = append(es, modeltest.Entry{S: en.s, Tokens: en.toks, Logits: en.mode, Hidden: en.hidden})
	}
	return e.Run(e.t, es...)
}

// step runs toks at the end of s alone.
func (e *env) step(s *seq, toks []int32, mode model.Logits) []float32 {
	e.t.Helper()
	return e.Step(e.t, s, toks, mode)
}

// prefill runs prompt in chunks of the given sizes and returns all logits.
func (e *env) prefill(s *seq, prompt []int32, sizes ...int) []float32 {
	e.t.Helper()
	var got []float32
	at := 0
	for _, n := range sizes {
		got = append(got, e.step(s, prompt[at:at+n], model.AllLogits)...)
		at += n
	}
	if at != len(prompt) {
		e.t.Fatalf("chunk sizes %v cover %d of %d tokens", sizes, at, len(prompt))
	}
	return got
}

// fixture holds the qwen3_next fixture's model and reference tensors.
type fixture struct {
	m                                 model.Model
	prompt, decodeIDs, greedy         []int32
	logits, hidden, decode, mtpLogits []float32
}

// onDevices runs fn against the fixture model on every backend of
// modeltest.Devices: the CPU, the strict backend and, with
// FERRITE_TEST_DEVICE set, that device.
func onDevices(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for name, newBackend := range modeltest.Devices() {
		t.Run(name, func(t *testing.T) {
			be, err := newBackend()
			if err != nil {
				t.Fatal(err)
			}
			fn(t, loadFixture(t, be))
		})
	}
}

func loadFixture(t testing.TB, be kernels.Backend) *fixture {
	t.Helper()
	fx, err := fixtures.Load("qwen3_next")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("fixture qwen3_next not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := weights.Open(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	m, err := model.New(cfg, ws, be)
	if err != nil {
		t.Fatal(err)
	}
	// Float32 KV: the fixture tolerances are float32 ones.
	if err := m.(model.DeviceModel).SetCacheDType(kernels.F32); err != nil {
		t.Fatal(err)
	}
	f := &fixture{m: m}
	ints := func(name string) []int32 {
		v, _, err := fx.Ints(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	floats := func(name string) []float32 {
		v, _, err := fx.Floats(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	f.prompt, f.decodeIDs, f.greedy = ints("prompt_ids"), ints("decode_ids"), ints("greedy_ids")
	f.logits, f.hidden = floats("prompt_logits"), floats("final_hidden")
	f.decode, f.mtpLogits = floats("decode_logits"), floats("mtp_logits")
	if info := m.Info(); info.Vocab != fx.Ref.V || info.Hidden != fx.Ref.H || info.Layers != fx.Ref.NumHiddenLayers {
		t.Fatalf("model vocab %d hidden %d layers %d, fixture %d %d %d", info.Vocab, info.Hidden, info.Layers, fx.Ref.V, fx.Ref.H, fx.Ref.NumHiddenLayers)
	}
	return f
}

// check compares got with the reference want within tol and logs the errors.
func check(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	rel := modeltest.Compare(t, what, got, want, tol)
	abs, _ := fixtures.MaxAbsDiff(got, want)
	t.Logf("%-22s max abs error %.3g, relative %.3g", what, abs, rel)
}

// TestFixture compares with transformers 5.17: prompt logits and final
// hidden states from one pass, cached decode logits, 16 greedy tokens and
// the MTP head's logits.
func TestFixture(t *testing.T) { onDevices(t, testFixture) }

func testFixture(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	info := f.m.Info()
	if _, ok := f.m.(model.MTPModel); !ok {
		t.Fatal("model loaded with mtp.* does not implement model.MTPModel")
	}
	t.Logf("KV bytes/token %d (2 full-attention layers + MTP), state bytes/sequence %d", info.KVBytesPerToken, info.StateBytesPerSeq)

	s := e.newSeq()
	out := e.run(entry{s, f.prompt, model.AllLogits, true})[0]
	check(t, "prompt logits", out.Logits, f.logits, fixtureTol)
	check(t, "final hidden", out.Hidden, f.hidden, fixtureTol)
	hidden := out.Hidden
	var dec []float32
	for _, id := range f.decodeIDs {
		dec = append(dec, e.step(s, []int32{id}, model.LastLogits)...)
	}
	check(t, "decode logits", dec, f.decode, fixtureTol)

	// MTP over the prompt: position p takes h_p and token p+1. It uses the
	// same cache handle (its own cache layer), which holds the prompt.
	T := len(f.prompt)
	mtpRun := func(h []float32) []float32 {
		o, err := f.m.(model.MTPModel).ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{
			{Tokens: f.prompt[1:], Pos: 0, KV: s.KV, Logits: model.AllLogits},
		}}, [][]float32{h[:(T-1)*info.Hidden]})
		if err != nil {
			t.Fatal(err)
		}
		return o.Seqs[0].Logits
	}
	check(t, "mtp logits", mtpRun(hidden), f.mtpLogits, fixtureTol)
	check(t, "mtp logits (ref h)", mtpRun(f.hidden), f.mtpLogits, fixtureTol)
	e.free(s)

	g := e.newSeq()
	next := fixtures.Argmax(e.step(g, f.prompt, model.LastLogits))
	var got []int32
	for range len(f.greedy) {
		got = append(got, next)
		next = fixtures.Argmax(e.step(g, []int32{next}, model.LastLogits))
	}
	if !slices.Equal(got, f.greedy) {
		t.Errorf("greedy tokens\n got %v\nwant %v", got, f.greedy)
	}
	e.free(g)
	e.checkEmpty()
}

// TestChunkedPrefill feeds the fixture prompt in chunks of several sizes
// (within and across the 64-token chunk of the delta rule, and down to one
// token at a time, i.e. the recurrent form throughout) and compares every
// position's logits with one pass.
func TestChunkedPrefill(t *testing.T) { onDevices(t, testChunkedPrefill) }

func testChunkedPrefill(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	T := len(f.prompt)
	ref := e.newSeq()
	full := e.prefill(ref, f.prompt, T)
	e.free(ref)
	check(t, "one chunk vs fixture", full, f.logits, fixtureTol)
	ones := make([]int, T)
	for i := range ones {
		ones[i] = 1
	}
	for _, sizes := range [][]int{{30, 30, 23}, {1, 64, 17, 1}, {65, 18}, {9, 8, 50, 16}, {3, 77, 2, 1}, ones} {
		name := fmt.Sprint(sizes)
		if len(sizes) == T {
			name = "token by token"
		}
		t.Run(name, func(t *testing.T) {
			s := e.newSeq()
			defer e.free(s)
			check(t, "chunked vs one chunk", e.prefill(s, f.prompt, sizes...), full, modeltest.Tol)
		})
	}
	e.checkEmpty()
}

// TestBatch runs sequences of different lengths together — a continued
// prefill, a fresh prompt asking for hidden states, decode rows — and
// compares each with the same sequence run alone.
func TestBatch(t *testing.T) { onDevices(t, testBatch) }

func testBatch(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	V, H := f.m.Info().Vocab, f.m.Info().Hidden
	rng := rand.New(rand.NewPCG(1, 2))
	randToks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(rng.IntN(V))
		}
		return out
	}
	pa, pb, pc, pd := f.prompt, randToks(21), randToks(70), randToks(5)
	next := randToks(2)

	// Alone.
	aloneA := func() []float32 {
		s := e.newSeq()
		defer e.free(s)
		return e.prefill(s, pa[:55], 40, 15)[40*V:]
	}()
	var aloneB, aloneD []float32
	for _, c := range []struct {
		p   []int32
		out *[]float32
	}{{pb, &aloneB}, {pd, &aloneD}} {
		s := e.newSeq()
		e.step(s, c.p, model.NoLogits)
		*c.out = e.step(s, next[:1], model.LastLogits)
		e.free(s)
	}
	sc := e.newSeq()
	aloneC := e.run(entry{sc, pc, model.AllLogits, true})[0]
	e.free(sc)

	// Together.
	a, b, c, d := e.newSeq(), e.newSeq(), e.newSeq(), e.newSeq()
	e.step(a, pa[:40], model.NoLogits)
	e.step(b, pb, model.NoLogits)
	e.step(d, pd, model.NoLogits)
	out := e.run(
		entry{a, pa[40:55], model.AllLogits, false},
		entry{b, next[:1], model.LastLogits, false},
		entry{c, pc, model.AllLogits, true},
		entry{d, next[:1], model.LastLogits, false},
	)
	check(t, "A continued prefill", out[0].Logits, aloneA, modeltest.Tol)
	check(t, "B decode", out[1].Logits, aloneB, modeltest.Tol)
	check(t, "C fresh prompt", out[2].Logits, aloneC.Logits, modeltest.Tol)
	check(t, "C hidden", out[2].Hidden, aloneC.Hidden, modeltest.Tol)
	check(t, "D decode", out[3].Logits, aloneD, modeltest.Tol)
	if len(out[0].Hidden) != 0 || len(out[2].Hidden) != len(pc)*H {
		t.Errorf("hidden states: %d and %d values, want 0 and %d", len(out[0].Hidden), len(out[2].Hidden), len(pc)*H)
	}

	// A batch of decode rows only (the sequences run in parallel), then
	// each sequence alone from a copy of its state.
	type fork struct {
		src, dst *seq
	}
	var forks []fork
	for _, s := range []*seq{a, b, c, d} {
		forks = append(forks, fork{s, e.Fork(t, s, s.KV.Len())})
	}
	var entries []entry
	for i, fk := range forks {
		entries = append(entries, entry{fk.src, next[i%2 : i%2+1], model.LastLogits, false})
	}
	out = e.run(entries...)
	for i, fk := range forks {
		check(t, fmt.Sprintf("decode batch row %d", i), out[i].Logits, e.step(fk.dst, next[i%2:i%2+1], model.LastLogits), modeltest.Tol)
		e.free(fk.src)
		e.free(fk.dst)
	}
	e.checkEmpty()
}

// TestRollback verifies three wrong speculative tokens, restores the state
// from a snapshot, truncates the cache and continues: the logits equal a
// sequence that never saw the wrong tokens.
func TestRollback(t *testing.T) { onDevices(t, testRollback) }

func testRollback(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	V := f.m.Info().Vocab
	ref := e.newSeq()
	full := e.prefill(ref, f.prompt, len(f.prompt))
	e.free(ref)

	s := e.newSeq()
	e.step(s, f.prompt[:50], model.NoLogits)
	snap, err := e.States.NewSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	e.States.Snapshot(snap, s.Slot)
	e.step(s, []int32{1, 2, 3}, model.AllLogits)
	e.States.Restore(s.Slot, snap)
	e.States.FreeSnapshot(snap)
	e.Cache.Truncate(s.KV, 50)
	check(t, "after rollback", e.step(s, f.prompt[50:60], model.AllLogits), full[50*V:60*V], modeltest.Tol)
	e.free(s)

	// A slot reused without Reset starts over at Pos 0.
	s = e.newSeq()
	e.step(s, f.prompt[:20], model.NoLogits)
	e.Cache.Truncate(s.KV, 0)
	check(t, "restart at Pos 0", e.step(s, f.prompt[:10], model.AllLogits), full[:10*V], modeltest.Tol)
	e.free(s)
	e.checkEmpty()
}

// TestMTPChunks runs the MTP head over the prompt in pieces (as drafting
// does, one position at a time at the end) and compares with one pass.
func TestMTPChunks(t *testing.T) { onDevices(t, testMTPChunks) }

func testMTPChunks(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	mm := f.m.(model.MTPModel)
	V, H := f.m.Info().Vocab, f.m.Info().Hidden
	T := len(f.prompt)
	s := e.newSeq()
	e.step(s, f.prompt, model.NoLogits)
	var got []float32
	at := 0
	for _, n := range []int{40, 1, 35, 1, 5} {
		o, err := mm.ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{
			{Tokens: f.prompt[at+1 : at+1+n], Pos: at, KV: s.KV, Logits: model.AllLogits, Hidden: true},
		}}, [][]float32{f.hidden[at*H : (at+n)*H]})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Seqs[0].Hidden) != n*H {
			t.Fatalf("MTP hidden: %d values, want %d", len(o.Seqs[0].Hidden), n*H)
		}
		got = append(got, o.Seqs[0].Logits...)
		at += n
	}
	if at != T-1 {
		t.Fatalf("covered %d of %d MTP positions", at, T-1)
	}
	check(t, "chunked mtp logits", got, f.mtpLogits, fixtureTol)

	// The MTP's hidden output, normed, reproduces its logits.
	o, err := mm.ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{
		{Tokens: f.prompt[T-1:], Pos: T - 2, KV: s.KV, Logits: model.LastLogits, Hidden: true},
	}}, [][]float32{f.hidden[(T-2)*H : (T-1)*H]})
	if err != nil {
		t.Fatal(err)
	}
	check(t, "mtp redo last", o.Seqs[0].Logits, f.mtpLogits[(T-2)*V:], fixtureTol)
	e.free(s)
	e.checkEmpty()
}

// TestErrors checks that malformed batches are refused without touching
// any state.
func TestErrors(t *testing.T) { onDevices(t, testErrors) }

func testErrors(t *testing.T, f *fixture) {
	e := newEnv(t, f.m)
	s, s2 := e.newSeq(), e.newSeq()
	defer func() { e.free(s); e.free(s2); e.checkEmpty() }()
	if err := e.Cache.Reserve(s.KV, 2); err != nil {
		t.Fatal(err)
	}
	if err := e.Cache.Reserve(s2.KV, 2); err != nil {
		t.Fatal(err)
	}
	other, err := linattn.NewStatePool(e.States.Memory(), []linattn.LayerShape{{Heads: 1, DK: 1, DV: 1, ConvK: 2, ConvChannels: 1}}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	one := func(pool *linattn.StatePool, slot *linattn.Slot) *model.Batch {
		return &model.Batch{Cache: e.Cache, States: pool, Seqs: []model.Seq{{Tokens: []int32{1, 2}, KV: s.KV, State: slot}}}
	}
	// The right layout in another device's memory.
	elsewhere, err := linattn.NewStatePool(strict.New(), f.m.(model.StateModel).StateLayout(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	elsewhereSlot, err := elsewhere.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]*model.Batch{
		"no pool":                one(nil, s.Slot),
		"no slot":                one(e.States, nil),
		"wrong pool":             one(other, s.Slot),
		"pool in another device": one(elsewhere, elsewhereSlot),
		"same slot twice": {Cache: e.Cache, States: e.States, Seqs: []model.Seq{
			{Tokens: []int32{1}, KV: s.KV, State: s.Slot}, {Tokens: []int32{1}, KV: s2.KV, State: s.Slot}}},
	}
	for name, b := range bad {
		if _, err := f.m.Forward(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	mm := f.m.(model.MTPModel)
	b := &model.Batch{Cache: e.Cache, Seqs: []model.Seq{{Tokens: []int32{1, 2}, KV: s.KV}}}
	H := f.m.Info().Hidden
	for _, h := range [][][]float32{nil, {make([]float32, H)}} {
		if _, err := mm.ForwardMTP(b, h); err == nil {
			t.Errorf("ForwardMTP with %d hidden blocks of %d values: no error", len(h), len(slices.Concat(h...)))
		}
	}
}

// tiny is a random-weight config in the hub's older format (top-level
// rope_theta and partial_rotary_factor, full_attention_interval instead of
// layer_types), with GQA 2:1 in the GatedDeltaNet, a dense layer from
// mlp_only_layers and another from decoder_sparse_step.
const tiny = `{
  "model_type": "qwen3_next", "hidden_size": 32, "num_hidden_layers": 6,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 40,
  "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
  "linear_value_head_dim": 12, "linear_conv_kernel_dim": 3, "full_attention_interval": 3,
  "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
  "shared_expert_intermediate_size": 12, "decoder_sparse_step": 2, "mlp_only_layers": [3],
  "norm_topk_prob": true, "vocab_size": 97, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
  "rope_theta": 10000000, "partial_rotary_factor": 0.25, "tie_word_embeddings": false,
  "mtp_num_hidden_layers": 1
}`

// TestRandomConfig builds the tiny config with random weights on every
// backend of modeltest.Devices, with BF16 and F32 KV caches, and checks the
// layout, the state accounting and chunked/incremental consistency across
// the delta rule's chunks.
func TestRandomConfig(t *testing.T) {
	for name, newBackend := range modeltest.Devices() {
		for _, kv := range []kernels.DType{kernels.BF16, kernels.F32} {
			t.Run(name+"/kv="+kv.String(), func(t *testing.T) {
				be, err := newBackend()
				if err != nil {
					t.Fatal(err)
				}
				randomConfig(t, modeltest.BuildOn(t, be, tiny, kernels.F32, nil), kv)
				if s, ok := be.(*strict.Device); ok && s.Steps() == 0 {
					t.Fatal("the strict backend ran no step")
				}
			})
		}
	}
}

// bf16Tol bounds two ways of computing the same logits with a BF16 KV
// cache: the delta rule's chunked and token-by-token forms round
// differently, so a key or value may round to the neighbouring bf16 (2⁻⁹
// relative) in one and not the other.
const bf16Tol = 1e-2

func randomConfig(t *testing.T, m model.Model, kv kernels.DType) {
	if _, ok := m.(model.MTPModel); !ok {
		t.Fatal("random model with mtp.* tensors is not an MTPModel")
	}
	if err := m.(model.DeviceModel).SetCacheDType(kv); err != nil {
		t.Fatal(err)
	}
	// Layers 2 and 5 are full attention (interval 3); the MTP layer is last.
	w := 1 * 16
	want := kvcache.Layout{{}, {}, {K: w, V: w}, {}, {}, {K: w, V: w}, {K: w, V: w}}
	for i := range want {
		want[i].DType = kv
	}
	if got := m.CacheLayout(); !slices.Equal(got, want) {
		t.Fatalf("cache layout %v, want %v", got, want)
	}
	shape := linattn.LayerShape{Heads: 4, DK: 8, DV: 12, ConvK: 3, ConvChannels: 2*2*8 + 4*12}
	sl := m.(model.StateModel).StateLayout()
	if len(sl) != 4 || slices.ContainsFunc(sl, func(s linattn.LayerShape) bool { return s != shape }) {
		t.Fatalf("state layout %+v, want 4 × %+v", sl, shape)
	}
	info := m.Info()
	if info.StateBytesPerSeq != 4*shape.Bytes() || info.KVBytesPerToken != want.BytesPerToken() {
		t.Fatalf("info %+v: want %d state bytes, %d KV bytes", info, 4*shape.Bytes(), want.BytesPerToken())
	}
	tol, incTol := modeltest.Tol, 1e-4
	if kv == kernels.BF16 {
		tol, incTol = bf16Tol, bf16Tol
	}

	e := newEnv(t, m)
	V := info.Vocab
	rng := rand.New(rand.NewPCG(9, 9))
	prompt := make([]int32, 140)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(V))
	}
	ref := e.newSeq()
	full := e.prefill(ref, prompt, len(prompt))
	e.free(ref)
	for _, sizes := range [][]int{{70, 70}, {1, 63, 1, 64, 11}, {100, 1, 1, 1, 37}} {
		s := e.newSeq()
		// A chunk of one token runs the delta rule's token-by-token form,
		// which sums in another order than the chunked one (2.2e-5 relative
		// on an AVX-512 CPU), so those splits get the incremental bound.
		ctol := tol
		if slices.Contains(sizes, 1) {
			ctol = max(tol, incTol)
		}
		check(t, fmt.Sprint("chunks ", sizes), e.prefill(s, prompt, sizes...), full, ctol)
		e.free(s)
	}
	s := e.newSeq()
	var inc []float32
	for i := range prompt {
		inc = append(inc, e.step(s, prompt[i:i+1], model.LastLogits)...)
	}
	e.free(s)
	// 140 sequential float32 state updates through norm weights near 2
	// compound rounding differently from the chunked float64 path; the
	// project's fp32 tolerance (1e-4 relative) applies here, not the tighter
	// one-pass bound.
	check(t, "token by token", inc, full, incTol)
	e.checkEmpty()
}

// TestNoMTP: without mtp.* tensors the model is not an MTPModel and caches
// no MTP layer.
func TestNoMTP(t *testing.T) {
	noMTP := modeltest.Build(t, tiny, kernels.BF16, func(name string) bool { return strings.HasPrefix(name, "mtp.") })
	if _, ok := noMTP.(model.MTPModel); ok {
		t.Error("model without mtp.* claims to be an MTPModel")
	}
	if n := len(noMTP.CacheLayout()); n != 6 {
		t.Errorf("cache layout without MTP has %d layers, want 6", n)
	}
}

// TestConfigErrors checks that bad configs and missing tensors are errors
// naming the culprit.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ edit, want string }{
		{`"layer_types": ["linear_attention", "full_attention"],`, "layer_types"},
		{`"layer_types": ["linear_attention", "x", "full_attention", "linear_attention", "linear_attention", "full_attention"],`, `"x"`},
		{`"linear_num_value_heads": 3,`, "linear_num_value_heads"},
		{`"num_experts_per_tok": 7,`, "num_experts_per_tok"},
	} {
		cfg := strings.Replace(tiny, "{", "{"+c.edit, 1)
		cfg = strings.Replace(cfg, `"linear_num_value_heads": 4,`, "", strings.Count(c.edit, "linear_num_value_heads"))
		cfg = strings.Replace(cfg, `"num_experts_per_tok": 2,`, "", strings.Count(c.edit, "num_experts_per_tok"))
		if _, err := modeltest.TryBuild(cfg, kernels.F32, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config with %s: error %v, want one naming %s", c.edit, err, c.want)
		}
	}
	missing := "model.layers.4.linear_attn.A_log"
	_, err := modeltest.TryBuild(tiny, kernels.F32, func(n string) bool { return n == missing })
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing %s: error %v", missing, err)
	}
}

// TestNoLinearLayers runs a config whose layers are all full attention: it
// needs no state pool, and ignores one if given.
func TestNoLinearLayers(t *testing.T) {
	cfg := strings.Replace(tiny, `"full_attention_interval": 3`, `"full_attention_interval": 1`, 1)
	m := modeltest.Build(t, cfg, kernels.F32, nil)
	if n := len(m.(model.StateModel).StateLayout()); n != 0 || m.Info().StateBytesPerSeq != 0 {
		t.Fatalf("all-attention model has %d state layers, %d state bytes", n, m.Info().StateBytesPerSeq)
	}
	c := modeltest.NewCache(t, m, 16)
	pool, err := linattn.NewStatePool(m.(model.DeviceModel).Device(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var logits [][]float32
	for _, states := range []*linattn.StatePool{nil, pool} {
		s := c.NewSeq()
		if err := c.Reserve(s, 5); err != nil {
			t.Fatal(err)
		}
		out, err := m.Forward(&model.Batch{Cache: c, States: states, Seqs: []model.Seq{{Tokens: []int32{1, 2, 3, 4, 5}, KV: s, Logits: model.AllLogits}}})
		if err != nil {
			t.Fatal(err)
		}
		logits = append(logits, out.Seqs[0].Logits)
		c.Free(s)
	}
	check(t, "with and without a pool", logits[1], logits[0], 0)
}

// TestBackendWithoutLinearOps: a device without the linear-attention ops
// (or a backend without the op set) is refused with a *model.OpsError,
// which --device auto answers by running on the CPU.
func TestBackendWithoutLinearOps(t *testing.T) {
	type plain struct{ kernels.Device } // hides the CPU's LinearAttentionOps
	type hostOnly struct{ kernels.Backend }
	for name, be := range map[string]kernels.Backend{"device": plain{cpu.New(1)}, "host": hostOnly{cpu.New(1)}} {
		var missing *model.OpsError
		if _, err := modeltest.TryBuildOn(be, tiny, kernels.F32, nil); !errors.As(err, &missing) {
			t.Errorf("%s: error %v, want a *model.OpsError", name, err)
		}
	}
}

// TestSuite runs the engine's shared architecture suite (incremental =
// full, chunked prefill, batched = alone, fork and rollback with state
// snapshots, bad batches) on the tiny config on every backend of
// modeltest.Devices, with BF16 and F32 KV caches.
func TestSuite(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.F32, nil) }
