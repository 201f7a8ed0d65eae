package glm5next

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// TestLayouts checks the cache and state layouts of the fixture model.
func TestLayouts(t *testing.T) { devices(t, testLayouts) }

func testLayouts(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	// [KDA, DSA, KDA, DSA] + MTP: kv_lora 32 latent, 2×16 index key data.
	f32 := kernels.F32
	dsa := kvcache.LayerWidth{K: 32, V: 32, DType: f32, VFloat32: true}
	want := kvcache.Layout{{DType: f32}, dsa, {DType: f32}, dsa, dsa}
	if got := m.CacheLayout(); !slices.Equal(got, want) {
		t.Errorf("CacheLayout %v, want %v", got, want)
	}
	if got := m.Info().KVBytesPerToken; got != 3*64*4 {
		t.Errorf("KVBytesPerToken %d, want %d", got, 3*64*4)
	}
	// BF16 latents, F32 index keys.
	if err := m.SetCacheDType(kernels.BF16); err != nil {
		t.Fatal(err)
	}
	if got := m.Info().KVBytesPerToken; got != 3*(32*2+32*4) {
		t.Errorf("BF16: KVBytesPerToken %d, want %d", got, 3*(32*2+32*4))
	}
	// 4 heads × 16, conv kernel 4 over q|k|v (3·64 channels).
	ws := linattn.LayerShape{Heads: 4, DK: 16, DV: 16, ConvK: 4, ConvChannels: 192}
	if got := m.StateLayout(); !slices.Equal(got, []linattn.LayerShape{ws, ws}) {
		t.Errorf("StateLayout %v", got)
	}
	// Per KDA layer: S 4·16·16 + conv 3·192 float32s.
	if got, want := m.Info().StateBytesPerSeq, int64(2*4*(4*16*16+3*192)); got != want {
		t.Errorf("StateBytesPerSeq %d, want %d", got, want)
	}
	var sm model.Model = m
	if _, ok := sm.(model.StateModel); !ok {
		t.Error("not a model.StateModel")
	}
	if model.AsDevice(sm) == nil || model.AsDevice(withMTP{m}) == nil {
		t.Error("not a model.DeviceModel")
	}
	if _, ok := sm.(model.MTPModel); ok {
		t.Error("a bare *Model must not be an MTPModel")
	}
}

// TestPoolsDropped shows the fixture exercises sparse selection: at late
// positions only index_topk/index_kpool of the complete pools are kept, a
// token can lose itself, and attending to everything instead changes the
// logits far beyond the tolerance.
func TestPoolsDropped(t *testing.T) { devices(t, testPoolsDropped) }

func testPoolsDropped(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	prompt := mustInts(t, fx, "prompt_ids")
	T, kp, keep := len(prompt), m.p.kpool, m.p.poolsPerQuery()
	e := newEnv(t, m, T+16, 1)
	rec := &record{dev: m.dev}
	m.traceSel = rec.add
	s := e.newSeq()
	sparse := e.run(s, prompt, model.AllLogits, false).Logits
	m.traceSel = nil
	e.free(s)

	dropped, selfLost := 0, 0
	for i, layer := range rec.keys {
		sel, w := rec.i32(i), rec.ts[i].Cols
		for pos := range T { // one sequence from position 0: row = position
			var toks []int32
			for _, tok := range sel[pos*w : (pos+1)*w] {
				if tok >= 0 {
					toks = append(toks, tok)
				}
			}
			cand, tail := (pos+1)/kp, (pos+1)%kp
			if got, want := (len(toks)-tail)/kp, min(keep, cand); got != want || (len(toks)-tail)%kp != 0 {
				t.Errorf("layer %d position %d: %d tokens attended, want %d pools and a tail of %d", layer, pos, len(toks), want, tail)
			}
			for _, tok := range toks {
				if int(tok) > pos {
					t.Fatalf("layer %d position %d attends to future token %d", layer, pos, tok)
				}
			}
			if cand > keep {
				dropped++
			}
			if !slices.Contains(toks, int32(pos)) {
				selfLost++
			}
			if pos == T-1 {
				t.Logf("layer %d, last position %d: %d of %d complete pools kept, %d of %d tokens attended",
					layer, pos, (len(toks)-tail)/kp, cand, len(toks), pos+1)
			}
		}
	}
	t.Logf("%d (row, layer) pairs dropped pools; %d did not attend to their own token", dropped, selfLost)
	if dropped == 0 || selfLost == 0 {
		t.Errorf("the fixture should drop pools (%d) and exclude some own tokens (%d)", dropped, selfLost)
	}
	check(t, "sparse prompt logits", sparse, mustFloats(t, fx, "prompt_logits"), fixtureTol)

	// The same weights with room for every pool: a different model.
	for _, l := range m.layers {
		if l.dsa != nil {
			l.dsa.idx.kp.Keep = (T + kp - 1) / kp
		}
	}
	e2 := newEnv(t, m, T+16, 1)
	s2 := e2.newSeq()
	dense := e2.run(s2, prompt, model.AllLogits, false).Logits
	rel, abs := fixtures.RelErr(dense, sparse)
	t.Logf("all pools kept: logits differ by %.3g (relative %.3g)", abs, rel)
	if rel < 100*fixtureTol {
		t.Errorf("keeping every pool changed the logits by only %.3g relative", rel)
	}
}

// TestChunkedPrefill feeds the prompt in uneven chunks (across pool and
// 64-token delta-rule chunk boundaries, with single tokens in between) and
// compares with one chunk.
func TestChunkedPrefill(t *testing.T) { devices(t, testChunkedPrefill) }

func testChunkedPrefill(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	prompt := mustInts(t, fx, "prompt_ids")
	e := newEnv(t, m, 2*len(prompt)+64, 2)
	ref := e.newSeq()
	full := e.run(ref, prompt, model.AllLogits, false).Logits
	s := e.newSeq()
	var got []float32
	at := 0
	for _, n := range []int{1, 6, 9, 1, 1, 47, 5, 13} {
		got = append(got, e.run(s, prompt[at:at+n], model.AllLogits, false).Logits...)
		at += n
	}
	if at != len(prompt) {
		t.Fatalf("chunks cover %d of %d tokens", at, len(prompt))
	}
	check(t, "chunked prefill", got, full, selfTol)
	check(t, "chunked vs transformers", got, mustFloats(t, fx, "prompt_logits"), fixtureTol)
}

// TestBatch runs sequences of different lengths in one pass — a fresh
// prompt, a continued prefill and a decode step — and compares each with
// the same work done alone.
func TestBatch(t *testing.T) { devices(t, testBatch) }

func testBatch(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	prompt := mustInts(t, fx, "prompt_ids")
	V, H := m.Info().Vocab, m.Info().Hidden
	e := newEnv(t, m, 8*len(prompt), 8)
	pa, pb, pc := prompt[:71], prompt[5:45], prompt[20:33]

	// Alone: A in one chunk; B as 25 + 15; C as 12 then one decode token.
	a0 := e.newSeq()
	aloneA := e.run(a0, pa, model.AllLogits, true)
	b0 := e.newSeq()
	e.run(b0, pb[:25], model.NoLogits, false)
	aloneB := e.run(b0, pb[25:], model.AllLogits, false)
	c0 := e.newSeq()
	e.run(c0, pc[:12], model.NoLogits, false)
	aloneC := e.run(c0, pc[12:], model.LastLogits, false)

	// Together: B and C prefilled alone first, then one pass of all three.
	a, b, c := e.newSeq(), e.newSeq(), e.newSeq()
	e.run(b, pb[:25], model.NoLogits, false)
	e.run(c, pc[:12], model.NoLogits, false)
	out, err := m.Forward(&model.Batch{Cache: e.Cache, States: e.States, Seqs: []model.Seq{
		e.batchSeq(b, pb[25:], model.AllLogits, false),
		e.batchSeq(a, pa, model.AllLogits, true),
		e.batchSeq(c, pc[12:], model.LastLogits, false),
	}})
	if err != nil {
		t.Fatal(err)
	}
	check(t, "batched A (fresh, 71)", out.Seqs[1].Logits, aloneA.Logits, selfTol)
	check(t, "batched A hidden", out.Seqs[1].Hidden, aloneA.Hidden, selfTol)
	check(t, "batched B (continued, 15)", out.Seqs[0].Logits, aloneB.Logits, selfTol)
	check(t, "batched C (decode)", out.Seqs[2].Logits, aloneC.Logits, selfTol)
	if len(out.Seqs[0].Hidden) != 0 || len(out.Seqs[2].Logits) != V || len(out.Seqs[1].Hidden) != len(pa)*H {
		t.Error("wrong output sizes")
	}
	// The states advanced exactly as alone: one more decode step agrees.
	next := []int32{7}
	check(t, "after batch, decode B", e.run(b, next, model.LastLogits, false).Logits,
		e.run(b0, next, model.LastLogits, false).Logits, selfTol)
	check(t, "after batch, decode C", e.run(c, next, model.LastLogits, false).Logits,
		e.run(c0, next, model.LastLogits, false).Logits, selfTol)
	for _, s := range []*seq{a0, b0, c0, a, b, c} {
		e.free(s)
	}
}

// flatCopy rewrites the fixture as a flat text checkpoint: the config's
// text_config at the top (model_type glm5_next, no vision_config) and the
// text weights renamed from model.language_model.* to model.* (the vision
// tower dropped). With inMemoryNames the KDA tensors use transformers'
// in-memory names (one conv1d [3C, 1, K], forget_gate.*) and the experts
// are fused (gate_up_proj / down_proj).
func flatCopy(t *testing.T, dir string, inMemoryNames bool) (*config.Config, *weights.Set) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	flat := top["text_config"].(map[string]any)
	flat["model_type"] = "glm5_next"
	flat["architectures"] = []any{"Glm5NextForCausalLM"}
	data, err := json.MarshalIndent(flat, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ModelType != "glm5_next" || cfg.WrapperType != "" {
		t.Fatalf("flat config: ModelType %q WrapperType %q", cfg.ModelType, cfg.WrapperType)
	}

	src, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	out := map[string]*weights.Tensor{}
	put := func(name string, tt *weights.Tensor) {
		c := *tt
		c.Name, c.File = "", ""
		out[name] = &c
	}
	get := func(name string) *weights.Tensor {
		tt, err := src.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		return tt
	}
	// concat stacks F32 tensors along dim 0 with the given new shape.
	concat := func(shape []int, names ...string) *weights.Tensor {
		var b []byte
		for _, n := range names {
			b = append(b, get(n).Data...)
		}
		return &weights.Tensor{DType: kernels.F32, Dtype: "F32", Shape: shape, Data: b}
	}
	const lm = "model.language_model."
	for _, name := range src.Names() {
		switch {
		case name == "lm_head.weight":
			put(name, get(name))
		case strings.HasPrefix(name, lm):
			put("model."+strings.TrimPrefix(name, lm), get(name))
		case strings.HasPrefix(name, "model.visual."):
		default:
			t.Fatalf("unexpected tensor %q", name)
		}
	}
	if inMemoryNames {
		C, K, I, Hd := 64, 4, 32, 64
		for _, l := range []int{0, 2} {
			pre := fmt.Sprintf("model.layers.%d.self_attn.", l)
			srcPre := fmt.Sprintf("%slayers.%d.self_attn.", lm, l)
			out[pre+"conv1d.weight"] = concat([]int{3 * C, 1, K},
				srcPre+"q_conv1d.weight", srcPre+"k_conv1d.weight", srcPre+"v_conv1d.weight")
			for _, n := range []string{"q", "k", "v"} {
				delete(out, pre+n+"_conv1d.weight")
			}
			for _, n := range []string{"f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log"} {
				out[pre+"forget_gate."+n] = out[pre+n]
				delete(out, pre+n)
			}
		}
		for _, l := range []int{2, 3, 4} {
			pre := fmt.Sprintf("model.layers.%d.mlp.experts.", l)
			var gu, dn []string
			for e := range 8 {
				p := fmt.Sprintf("%slayers.%d.mlp.experts.%d.", lm, l, e)
				gu = append(gu, p+"gate_proj.weight", p+"up_proj.weight")
				dn = append(dn, p+"down_proj.weight")
				for _, n := range []string{"gate_proj", "up_proj", "down_proj"} {
					delete(out, fmt.Sprintf("%s%d.%s.weight", pre, e, n))
				}
			}
			out[pre+"gate_up_proj"] = concat([]int{8, 2 * I, Hd}, gu...)
			out[pre+"down_proj"] = concat([]int{8, Hd, I}, dn...)
		}
	}
	return cfg, weights.NewMem(out)
}

// TestFlatCheckpoint loads the fixture as a flat text checkpoint (renamed
// in memory) and checks it gives the wrapper's logits exactly; with
// transformers' in-memory tensor names and fused experts, up to rounding.
func TestFlatCheckpoint(t *testing.T) { devices(t, testFlatCheckpoint) }

func testFlatCheckpoint(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	prompt := mustInts(t, fx, "prompt_ids")
	logits := func(m *Model) ([]float32, []float32) {
		if err := m.SetCacheDType(kernels.F32); err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, m, len(prompt)+16, 1)
		s := e.newSeq()
		defer e.free(s)
		out := e.run(s, prompt, model.AllLogits, true)
		mt, err := withMTP{m}.ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{
			{Tokens: prompt[1:], KV: s.KV, Logits: model.AllLogits},
		}}, [][]float32{out.Hidden[:(len(prompt)-1)*m.Info().Hidden]})
		if err != nil {
			t.Fatal(err)
		}
		return out.Logits, mt.Seqs[0].Logits
	}
	wrapped, wrappedMTP := logits(fixtureModel(t, be, fx))
	check(t, "wrapper vs transformers", wrapped, mustFloats(t, fx, "prompt_logits"), fixtureTol)

	cfg, w := flatCopy(t, fx.Dir, false)
	m := build(t, be, cfg, w)
	if m.mtp == nil {
		t.Fatal("flat checkpoint: MTP layer not loaded")
	}
	flat, flatMTP := logits(m)
	if slices.Equal(flat, wrapped) && slices.Equal(flatMTP, wrappedMTP) {
		t.Log("flat checkpoint: prompt and MTP logits identical to the wrapper's")
	} else {
		check(t, "flat vs wrapper", flat, wrapped, 0)
		check(t, "flat vs wrapper MTP", flatMTP, wrappedMTP, 0)
	}

	cfg, w = flatCopy(t, fx.Dir, true)
	mem, memMTP := logits(build(t, be, cfg, w))
	check(t, "in-memory names vs wrapper", mem, wrapped, selfTol)
	check(t, "in-memory names vs wrapper MTP", memMTP, wrappedMTP, selfTol)
}

// tinyRandom is a random-weight configuration exercising what the fixture
// does not: a shared indexer layer, Kimi's softplus gate (no lower bound),
// no tail selection, three DSA layers in a row and no MTP.
const tinyRandom = `{
  "model_type": "glm5_next", "hidden_size": 32, "num_hidden_layers": 4, "vocab_size": 97,
  "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 4, "n_shared_experts": 2,
  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5,
  "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 8,
  "qk_nope_head_dim": 8, "qk_rope_head_dim": 0, "v_head_dim": 8,
  "index_n_heads": 2, "index_head_dim": 8, "index_topk": 6, "index_kpool": 3,
  "index_kpool_always_select_tail": false,
  "layer_types": ["linear_attention", "deepseek_sparse_attention", "full_attention", "deepseek_sparse_attention"],
  "mlp_layer_types": ["dense", "sparse", "dense", "sparse"],
  "indexer_types": ["full", "full", "shared", "full"],
  "linear_num_heads": 2, "linear_head_dim": 8, "linear_conv_kernel_dim": 3, "linear_lower_bound": null,
  "hc_mult": 3, "hc_sinkhorn_iters": 10, "hc_eps": 1e-6, "swiglu_limit": 0.5, "rms_norm_eps": 1e-5
}`

// TestRandomConfig checks incremental decode and chunked prefill against
// one full forward on tinyRandom, and that the shared layer has no cache of
// its own.
func TestRandomConfig(t *testing.T) {
	devices(t, func(t *testing.T, be kernels.Backend) {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			t.Run(dt.String(), func(t *testing.T) { testRandomConfig(t, be, dt) })
		}
	})
}

func testRandomConfig(t *testing.T, be kernels.Backend, dt kernels.DType) {
	cfg, err := config.Parse("config.json", []byte(tinyRandom))
	if err != nil {
		t.Fatal(err)
	}
	m := build(t, be, cfg, randweights.New(7, dt))
	bf := kernels.BF16 // the default KV cache
	want := kvcache.Layout{{DType: bf}, {K: 8, V: 16, DType: bf, VFloat32: true}, {K: 8, DType: bf}, {K: 8, V: 16, DType: bf, VFloat32: true}}
	if got := m.CacheLayout(); !slices.Equal(got, want) {
		t.Fatalf("CacheLayout %v, want %v", got, want)
	}
	if m.p.lowerBound != 0 || m.layers[2].dsa.idx != nil {
		t.Fatal("expected the softplus gate and a shared layer 2")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := make([]int32, 29)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(97))
	}
	V := m.Info().Vocab
	e := newEnv(t, m, 4*len(prompt), 3)
	ref := e.newSeq()
	full := e.run(ref, prompt, model.AllLogits, false).Logits
	for _, v := range full {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatal("non-finite logits")
		}
	}
	inc := e.newSeq()
	got := e.run(inc, prompt[:4], model.AllLogits, false).Logits
	for i := 4; i < len(prompt); i++ {
		got = append(got, e.run(inc, prompt[i:i+1], model.LastLogits, false).Logits...)
	}
	// With bf16 weights a device may compute one-row (decode) and many-row
	// products differently in their last bits (cuda: a float32 GEMV for one
	// row, cuBLASLt with x split into two bf16 terms for more), and the BF16
	// cache can round such a key or value to the neighbouring bf16: the
	// BF16-cache suites' modeltest.BF16KVTol then (2.3e-4 seen on an H200,
	// 2.7e-7 with f32 weights).
	tol := selfTol
	if dt == kernels.BF16 {
		tol = modeltest.BF16KVTol
	}
	check(t, "incremental decode", got, full, tol)
	ch := e.newSeq()
	got = got[:0]
	at := 0
	for _, n := range []int{2, 11, 1, 15} {
		got = append(got, e.run(ch, prompt[at:at+n], model.AllLogits, false).Logits...)
		at += n
	}
	check(t, "chunked prefill", got, full, tol)
	if len(full) != len(prompt)*V {
		t.Fatal("logit rows")
	}
}

// TestErrors checks bad batches and configs are reported, not run.
func TestErrors(t *testing.T) { devices(t, testErrors) }

func testErrors(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	e := newEnv(t, m, 64, 2)
	s := e.newSeq()
	defer e.free(s)
	bs := e.batchSeq(s, []int32{1, 2}, model.LastLogits, false)
	noSlot := bs
	noSlot.State = nil
	other, err := linattn.NewStatePool(e.States.Memory(), []linattn.LayerShape{{Heads: 1, DK: 1, DV: 1, ConvK: 1}}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := linattn.NewStatePool(strict.New(), m.StateLayout(), 1<<20) // the right layout in another device's memory
	if err != nil {
		t.Fatal(err)
	}
	elsewhereSlot, err := elsewhere.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	onElsewhere := bs
	onElsewhere.State = elsewhereSlot
	otherCache, err := kvcache.New(m.CacheLayout(), kvcache.Options{Budget: 1 << 20, Memory: strict.New()})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range []model.Batch{
		{Cache: e.Cache, Seqs: []model.Seq{bs}},                                                                // no state pool
		{Cache: e.Cache, States: e.States, Seqs: []model.Seq{noSlot}},                                          // no slot
		{Cache: e.Cache, States: other, Seqs: []model.Seq{bs}},                                                 // wrong pool
		{Cache: e.Cache, States: e.States, Seqs: []model.Seq{bs, bs}},                                          // repeated handle
		{Cache: nil, States: e.States, Seqs: []model.Seq{bs}},                                                  // no cache
		{Cache: e.Cache, States: e.States, Seqs: []model.Seq{{Tokens: []int32{600}, KV: s.KV, State: s.Slot}}}, // token out of range
		{Cache: e.Cache, States: elsewhere, Seqs: []model.Seq{onElsewhere}},                                    // states in another device's memory
		{Cache: otherCache, States: e.States, Seqs: []model.Seq{bs}},                                           // cache in another device's memory
	} {
		if _, err := m.Forward(&b); err == nil {
			t.Errorf("bad batch %d: no error", i)
		}
	}
	if _, err := (withMTP{m}).ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{bs}}, [][]float32{make([]float32, 3)}); err == nil {
		t.Error("ForwardMTP with a short hidden block: no error")
	}

	base := map[string]any{}
	if err := json.Unmarshal([]byte(tinyRandom), &base); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]map[string]any{
		"rope":           {"qk_rope_head_dim": 8},
		"shared first":   {"indexer_types": []any{"full", "shared", "full", "full"}},
		"topk not pools": {"index_topk": 7},
		"layer type":     {"layer_types": []any{"linear_attention", "mamba", "linear_attention", "linear_attention"}},
		"kv heads":       {"num_key_value_heads": 1},
		"no q lora":      {"q_lora_rank": nil},
		"bound":          {"linear_lower_bound": 1.0},
	} {
		c := map[string]any{}
		for k, v := range base {
			c[k] = v
		}
		for k, v := range edit {
			c[k] = v
		}
		data, _ := json.Marshal(c)
		cfg, err := config.Parse("config.json", data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg, randweights.New(1, kernels.F32), be); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// A backend with the GQA family's op set only.
	cfg, _ := config.Parse("config.json", []byte(tinyRandom))
	var missing *model.OpsError
	if _, err := New(cfg, randweights.New(1, kernels.F32), struct{ kernels.Device }{be.(kernels.Device)}); !errors.As(err, &missing) {
		t.Errorf("backend without the op set: %v", err)
	}
	// A missing tensor is named.
	src := randweights.New(1, kernels.F32)
	src.Missing = func(n string) bool { return strings.HasSuffix(n, "index_kpool_compress_ape") }
	if _, err := New(cfg, src, be); err == nil || !strings.Contains(err.Error(), "index_kpool_compress_ape") {
		t.Errorf("missing tensor: %v", err)
	}
}

// TestRollbackAndFork speculates wrong tokens across pool boundaries and
// rolls them back (kvcache.Truncate for the latents and index keys, a state
// snapshot for KDA), and forks a sequence mid-pool: both continue exactly
// like the uninterrupted prompt. Pools completed by the rejected tokens
// must be re-pooled from the real ones.
func TestRollbackAndFork(t *testing.T) { devices(t, testRollbackAndFork) }

func testRollbackAndFork(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	prompt := mustInts(t, fx, "prompt_ids")
	V := m.Info().Vocab
	e := newEnv(t, m, 4*len(prompt)+64, 4)
	ref := e.newSeq()
	full := e.run(ref, prompt, model.AllLogits, false).Logits

	s := e.newSeq()
	e.run(s, prompt[:50], model.NoLogits, false)
	rollback := e.Checkpoint(t, s)
	// Fork at 50 (inside pool 12 = [48, 52)), before the speculation.
	f := e.Fork(t, s, 50)

	// Seven wrong tokens complete pools 12 and 13, then are rejected.
	e.run(s, []int32{1, 2, 3, 4, 5, 6, 7}, model.AllLogits, false)
	rollback()
	check(t, "after rollback", e.run(s, prompt[50:], model.AllLogits, false).Logits, full[50*V:], selfTol)
	check(t, "fork", e.run(f, prompt[50:60], model.AllLogits, false).Logits, full[50*V:60*V], selfTol)
	for _, q := range []*seq{ref, s, f} {
		e.free(q)
	}
}

// TestSuite runs the engine's shared architecture suite (incremental =
// full, chunked prefill, batched = alone, fork and rollback with state
// snapshots, bad batches) on tinyRandom on every backend of
// modeltest.Devices, with BF16 and F32 KV caches.
func TestSuite(t *testing.T) { modeltest.RunDevices(t, tinyRandom, kernels.F32, nil) }
