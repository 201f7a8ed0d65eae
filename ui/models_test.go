package ui

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/tokenizer"

	tea "github.com/charmbracelet/bubbletea"
)

// twoModels is a catalog of the chat's own engine A and two others: B
// loads, "broken" fails.
func twoModels(a *fakeEngine) (*fakeModels, *fakeEngine) {
	b := newFakeEngine(fakeReply{chunks: []string{"from B"}})
	b.info = ModelInfo{Name: "Model-B", Arch: "qwen3", MaxContext: 8192, MTP: true, Draft: 3}
	f := &fakeModels{
		entries: []ModelEntry{
			{Name: a.info.Name, Arch: "fake", Source: "built-in", Size: 3 << 20},
			{Name: "Model-B", Arch: "qwen3", Quant: "Q4_K_M", Source: "hf-cache", Path: "/hub/models--x--b/snapshots/1", Size: 1536 << 20},
			{Name: "broken", Arch: "llama", Source: "ferrite", Path: "/models/broken", Problem: "no .safetensors weights"},
		},
		engines: map[string]*fakeEngine{"Model-B": b},
		fail:    map[string]error{"broken": errors.New("no .safetensors weights in /models/broken")},
	}
	return f, b
}

// switchOptions are testOptions with twoModels(a) to switch to, a's
// closing recorded in f (f.closedNames).
func switchOptions(t *testing.T, a *fakeEngine) (Options, *fakeModels, *fakeEngine) {
	f, b := twoModels(a)
	opts := testOptions(t)
	opts.Models = f
	opts.Closer = f.closer(a.info.Name)
	return opts, f, b
}

func TestModelsList(t *testing.T) {
	a := newFakeEngine()
	f, _ := twoModels(a)
	opts := testOptions(t)
	opts.Models = f
	h := start(t, a, opts)
	h.line("/models")
	h.untilNotice("Models (/model NAME or NUMBER switches):")
	text := lastNotice(h.final(), "Models (")
	for _, want := range []string{
		"Using Fake-1B (fake).",
		" 1 ● Fake-1B  ",
		" 2   Model-B  qwen3",
		"1.5 GiB  hf-cache · Q4_K_M",
		" 3   broken   llama",
		"ferrite  /models/broken  ⚠ no .safetensors weights",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the list lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "/hub/models--x--b") {
		t.Errorf("the HF cache path is shown (the name says it):\n%s", text)
	}
}

func TestModelSwitchWhileAReplyRuns(t *testing.T) {
	hold := make(chan struct{})
	a := newFakeEngine(fakeReply{chunks: []string{"slow answer from A"}, hold: hold})
	opts, f, b := switchOptions(t, a)
	f.hold = make(chan struct{})
	h := start(t, a, opts)

	h.line("question for A")
	h.waitFor("generating")
	h.line("/model Model-B")
	// The load is in progress, with its stage in the status bar, and the
	// chat stays usable.
	h.waitFor("⟳ loading Model-B · reading weights")
	h.line("/set seed 9")
	h.untilNotice("Set seed.")
	close(f.hold)
	h.untilNotice("Switched to Model-B (qwen3, context 8192 tokens)")
	h.untilNotice("Fake-1B finishes the 1 replies in progress")
	if got := f.closedNames(); len(got) != 0 {
		t.Fatalf("closed %v while A still generates", got)
	}
	// A's reply ends on A; then A is closed.
	close(hold)
	h.waitFor("slow answer from A")
	h.settle()
	h.until("A to be closed", func(*model) bool { return slices.Equal(f.closedNames(), []string{"Fake-1B"}) })

	// New messages go to B.
	h.line("question for B")
	h.waitFor("from B")
	h.settle()
	m := h.final()
	if n := len(b.requests()); n != 1 {
		t.Errorf("B got %d requests", n)
	}
	if n := len(a.requests()); n != 1 {
		t.Errorf("A got %d requests", n)
	}
	if m.info.Name != "Model-B" || m.chat.Model.Name != "Model-B" {
		t.Errorf("model after the switch: %+v / %+v", m.info, m.chat.Model)
	}
	msgs := m.chat.Messages
	if len(msgs) != 4 || msgs[1].Model != "Fake-1B" || msgs[3].Model != "Model-B" {
		t.Errorf("replies' models: %+v", msgs)
	}
	if m.chat.Settings.Seed != 9 {
		t.Errorf("the /set during the load was lost: %+v", m.chat.Settings)
	}
}

func TestModelLoadFailureKeepsTheCurrentOne(t *testing.T) {
	a := newFakeEngine(fakeReply{chunks: []string{"still A"}})
	opts, f, _ := switchOptions(t, a)
	h := start(t, a, opts)
	h.line("/model broken")
	h.untilNotice("Could not load broken: no .safetensors weights in /models/broken. Still using Fake-1B.")
	h.line("/model nothing-like-it")
	h.untilNotice(`no model "nothing-like-it"`)
	h.line("/model Fake-1B")
	h.waitFor("Already using Fake-1B.")
	h.line("hello")
	h.waitFor("still A")
	h.settle()
	m := h.final()
	if m.info.Name != "Fake-1B" || m.loading != nil {
		t.Errorf("info %+v, loading %+v", m.info, m.loading)
	}
	if got := f.closedNames(); len(got) != 0 {
		t.Errorf("closed %v", got)
	}
}

func TestModelNameCompletes(t *testing.T) {
	a := newFakeEngine()
	f, _ := twoModels(a)
	opts := testOptions(t)
	opts.Models = f
	h := start(t, a, opts)
	// The list is fetched at start, so the names complete.
	h.until("the model list", func(m *model) bool { return len(m.modelList) == 3 })
	h.typeText("/model Mod")
	h.waitFor("qwen3 · hf-cache · 1.5 GiB")
	h.line("") // completes and runs
	h.untilNotice("Switched to Model-B")
	h.final()
}

func TestModelSwitchByNumberClosesAnIdleEngineAtOnce(t *testing.T) {
	a := newFakeEngine()
	opts, f, _ := switchOptions(t, a)
	h := start(t, a, opts)
	h.line("/model 2")
	h.untilNotice("Switched to Model-B")
	h.until("A to be closed", func(*model) bool { return slices.Equal(f.closedNames(), []string{"Fake-1B"}) })
	h.final()
}

func TestModelWithoutCatalog(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/model x")
	h.waitFor("started without a model catalog")
	h.line("/models")
	h.waitFor("No other models")
	h.final()
}

func TestRunClosesOwnedEngines(t *testing.T) {
	a := newFakeEngine()
	opts, f, _ := switchOptions(t, a)
	in, _, done := runChat(t, t.Context(), a, opts)
	_, _ = in.Write([]byte("/model Model-B\r"))
	for range 500 {
		if slices.Contains(f.closedNames(), "Fake-1B") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, _ = in.Write([]byte("/quit\r"))
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if got := f.closedNames(); !slices.Equal(got, []string{"Fake-1B", "Model-B"}) {
		t.Errorf("closed %v, want both engines", got)
	}
}

// TestModelNumberIsTheListPosition: /model 5 is entry 5 of /models, in the
// completion popup too, although another model's name holds a 5.
func TestModelNumberIsTheListPosition(t *testing.T) {
	a := newFakeEngine()
	five := newFakeEngine(fakeReply{chunks: []string{"from the fifth"}})
	five.info = ModelInfo{Name: "mistral-7b", Arch: "mistral", MaxContext: 4096}
	glm := newFakeEngine()
	glm.info = ModelInfo{Name: "glm5_next", Arch: "glm5_next", MaxContext: 4096}
	f := &fakeModels{
		entries: []ModelEntry{
			{Name: a.info.Name, Arch: "fake", Source: "built-in"},
			{Name: "qwen3", Arch: "qwen3", Source: "config", Path: "/m/qwen3"},
			{Name: "glm5_next", Arch: "glm5_next", Source: "config", Path: "/m/glm5_next"},
			{Name: "llama", Arch: "llama", Source: "config", Path: "/m/llama"},
			{Name: "mistral-7b", Arch: "mistral", Source: "config", Path: "/m/mistral-7b"},
		},
		engines: map[string]*fakeEngine{"mistral-7b": five, "glm5_next": glm},
	}
	opts := testOptions(t)
	opts.Models = f
	h := start(t, a, opts)
	h.until("the model list", func(m *model) bool { return len(m.modelList) == 5 })
	h.typeText("/model 5")
	h.waitFor("5 mistral-7b")
	h.until("the popup on entry 5", func(m *model) bool {
		return m.comp.open() && len(m.comp.items) == 1 && m.comp.selected().value == "/model 5"
	})
	h.key(tea.KeyEnter)
	h.untilNotice("Switched to mistral-7b")
	// A number past the list is matched against the names, as Find does.
	h.typeText("/model 55")
	h.until("no positional item", func(m *model) bool { return !m.comp.open() })
	m := h.final()
	if m.info.Name != "mistral-7b" {
		t.Errorf("loaded %s, want entry 5, mistral-7b", m.info.Name)
	}
}

// TestModelOpenedByFolderIsListed: a model /model DIR opened outside the
// catalog's places is in /models, and its number switches back to it.
func TestModelOpenedByFolderIsListed(t *testing.T) {
	a := newFakeEngine()
	f, _ := twoModels(a)
	c := newFakeEngine()
	c.info = ModelInfo{Name: "model-c", Arch: "llama", MaxContext: 2048}
	f.engines["model-c"] = c
	f.engines[a.info.Name] = a
	f.dirs = map[string]ModelEntry{"/elsewhere/model-c": {Name: "model-c", Arch: "llama", Source: "path", Path: "/elsewhere/model-c"}}
	opts := testOptions(t)
	opts.Models = f
	h := start(t, a, opts)
	h.line("/model /elsewhere/model-c")
	h.untilNotice("Switched to model-c")
	h.line("/models")
	h.untilNotice(" 4 ● model-c  llama          ?  path  /elsewhere/model-c")
	h.line("/model 1")
	h.untilNotice("Switched to Fake-1B")
	h.line("/model 4")
	h.until("the second switch to model-c", func(m *model) bool { return m.loading == nil && m.info.Name == "model-c" })
	if m := h.final(); m.info.Name != "model-c" {
		t.Errorf("using %s, want model-c", m.info.Name)
	}
}

// TestModelSwitchFollowsTheRecommendation: /model applies the new model's
// recommended sampling (Options.SamplingFor) to the chat's settings that
// still have the previous model's, and says so; a value /set changed
// stays. Without SamplingFor the settings stay as they are.
func TestModelSwitchFollowsTheRecommendation(t *testing.T) {
	f64 := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	recommend := func(rec tokenizer.Sampling) Settings { // settings.Config.SamplingFor with nothing given
		s := DefaultSettings()
		if rec.Temperature != nil {
			s.Temperature = *rec.Temperature
		}
		if rec.TopP != nil {
			s.TopP = *rec.TopP
		}
		if rec.TopK != nil {
			s.TopK = *rec.TopK
		}
		return s
	}
	for _, follow := range []bool{true, false} {
		t.Run(fmt.Sprintf("follow=%v", follow), func(t *testing.T) {
			a := newFakeEngine()
			a.info.Sampling = tokenizer.Sampling{Temperature: f64(0)} // greedy
			opts, _, b := switchOptions(t, a)
			b.info.Sampling = tokenizer.Sampling{Temperature: f64(0.6), TopK: i(20)}
			first := recommend(a.info.Sampling)
			opts.Settings = &first
			if follow {
				opts.SamplingFor = recommend
			}
			h := start(t, a, opts)
			h.line("/set top_k 5")
			h.untilNotice("Set top_k.")
			h.line("/model Model-B")
			h.untilNotice("Switched to Model-B")
			if follow {
				h.untilNotice("Sampling as Model-B recommends: temperature 0.6. /set changes it")
			}
			m := h.final()
			s := m.chat.Settings
			want := 0.0
			if follow {
				want = 0.6
			}
			if s.Temperature != want || s.TopK != 5 || s.TopP != first.TopP {
				t.Errorf("after /model: temperature %g, top_k %d, top_p %g; want %g, 5 (set), %g", s.Temperature, s.TopK, s.TopP, want, first.TopP)
			}
			if !follow && lastNotice(m, "Sampling as") != "" {
				t.Errorf("a sampling note without Options.SamplingFor: %q", lastNotice(m, "Sampling as"))
			}
		})
	}
}

func TestSamplingNote(t *testing.T) {
	d := DefaultSettings()
	if n := SamplingNote("m", d, d); n != "" {
		t.Errorf("nothing recommended: note %q", n)
	}
	g := d
	g.Temperature = 0
	if n := SamplingNote("ferrite-tiny", d, g); n != "Sampling as ferrite-tiny recommends: temperature 0 (greedy decoding). /set changes it; the configuration file and the flags win." {
		t.Errorf("greedy: note %q", n)
	}
	q := d
	q.Temperature, q.TopK = 0.6, 20
	if n := SamplingNote("qwen3", d, q); !strings.Contains(n, "temperature 0.6, top_k 20.") || strings.Contains(n, "top_p") {
		t.Errorf("qwen3: note %q", n)
	}
}

// gpuSwitch is switchOptions with A on a GPU (ModelInfo.DeviceMemory) and
// Model-B too large to fit beside it: it fits once A is closed.
func gpuSwitch(t *testing.T, a *fakeEngine) (Options, *fakeModels, *fakeEngine) {
	a.info.DeviceMemory = true
	opts, f, b := switchOptions(t, a)
	f.room = func(name string) bool { return name != "Model-B" || slices.Contains(f.closed, "Fake-1B") }
	return opts, f, b
}

func (f *fakeModels) loadsDone() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.loads...)
}

// TestModelSwitchMakesRoomOnTheGPU: a model that does not fit the GPU
// beside the one in use is loaded after that one is unloaded, and says so;
// while it loads, nothing can be sent to the unloaded model.
func TestModelSwitchMakesRoomOnTheGPU(t *testing.T) {
	a := newFakeEngine()
	opts, f, b := gpuSwitch(t, a)
	f.hold = make(chan struct{})
	h := start(t, a, opts)
	h.line("/model Model-B")
	h.untilNotice("Model-B does not fit beside Fake-1B (the weights take 15.0 GiB and fake-gpu:0 has 7.5 GiB free): unloading Fake-1B to make room.")
	h.until("A to be closed", func(*model) bool { return slices.Equal(f.closedNames(), []string{"Fake-1B"}) })
	h.line("question while B loads")
	h.waitFor("Fake-1B was unloaded to make room: wait for Model-B to load")
	close(f.hold)
	h.untilNotice("Fake-1B was unloaded to make room.")
	h.line("question for B")
	h.waitFor("from B")
	h.settle()
	m := h.final()
	if m.info.Name != "Model-B" || len(a.requests()) != 0 || len(b.requests()) != 1 {
		t.Errorf("model %s; A got %d requests, B %d", m.info.Name, len(a.requests()), len(b.requests()))
	}
	if got, want := f.loadsDone(), []string{"Model-B keep=true", "Model-B keep=false"}; !slices.Equal(got, want) {
		t.Errorf("loads %q, want %q", got, want)
	}
	if got := f.closedNames(); !slices.Equal(got, []string{"Fake-1B"}) {
		t.Errorf("closed %v, want A once", got)
	}
}

// TestModelSwitchNeedsRoomWhileAReplyRuns: with a reply running on the
// model in use, nothing is unloaded; the user is told how to make room.
func TestModelSwitchNeedsRoomWhileAReplyRuns(t *testing.T) {
	hold := make(chan struct{})
	a := newFakeEngine(fakeReply{chunks: []string{"slow answer from A"}, hold: hold})
	opts, f, _ := gpuSwitch(t, a)
	h := start(t, a, opts)
	h.line("question for A")
	h.waitFor("generating")
	h.line("/model Model-B")
	h.untilNotice("Stop Fake-1B's replies (esc), then /model Model-B again: it is unloaded first. Still using Fake-1B.")
	close(hold)
	h.waitFor("slow answer from A")
	h.settle()
	m := h.final()
	if m.info.Name != "Fake-1B" || len(f.closedNames()) != 0 {
		t.Errorf("model %s, closed %v; want A kept", m.info.Name, f.closedNames())
	}
}

// TestModelSwitchAfterUnloadFails: when the model fails to load after the
// one in use was unloaded for it, that one is loaded again; when that
// fails too, nothing can be sent until /model opens a model.
func TestModelSwitchAfterUnloadFails(t *testing.T) {
	a := newFakeEngine(fakeReply{chunks: []string{"A again"}})
	opts, f, _ := gpuSwitch(t, a)
	f.fail["Model-B"] = errBoom
	f.engines["Fake-1B"] = a
	h := start(t, a, opts)
	h.line("/model Model-B")
	h.untilNotice("Could not load Model-B: boom: the engine fell over. Fake-1B is loaded again and in use.")
	h.line("hello")
	h.waitFor("A again")
	h.settle()
	if got, want := f.loadsDone(), []string{"Model-B keep=true", "Model-B keep=false", "Fake-1B keep=false"}; !slices.Equal(got, want) {
		t.Errorf("loads %q, want %q", got, want)
	}

	// The model in use again is on the GPU too: the next switch makes room
	// again, and this time A cannot be loaded back.
	f.mu.Lock()
	f.room = func(string) bool { return false }
	f.mu.Unlock()
	delete(f.engines, "Fake-1B")
	h.line("/model Model-B")
	h.untilNotice("Loading Fake-1B again failed too: no engine for Fake-1B. /model NAME opens a model.")
	h.line("anyone there?")
	h.waitFor("no model is loaded: /model NAME opens one")
	h.line("/stats")
	h.untilNotice("Model: Fake-1B (fake), unloaded to make room for another")
	// /model opens the unloaded model again (it is not "already in use"),
	// then, once B loads, a switch to B unloads A once more.
	f.mu.Lock()
	f.engines["Fake-1B"] = a
	delete(f.fail, "Model-B")
	f.mu.Unlock()
	h.line("/model Fake-1B")
	h.untilNotice("Switched to Fake-1B")
	h.line("/model Model-B")
	h.untilNotice("Switched to Model-B")
	m := h.final()
	if m.info.Name != "Model-B" {
		t.Errorf("model %s, want Model-B", m.info.Name)
	}
	if got, want := f.closedNames(), []string{"Fake-1B", "Fake-1B", "Fake-1B"}; !slices.Equal(got, want) {
		t.Errorf("closed %v, want A each time B needed its room", got)
	}
}
