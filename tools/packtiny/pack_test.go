package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/device"
)

// TestPackServesQuantizedModel packs transformers fixtures (glm5_next: the
// built-in model's architecture, with MoE, MTP and a vision tower; qwen3)
// and checks that the GGUF file, served by CheckpointWeights, builds the
// model `--quant q8_0` builds from the checkpoint: the same logits, bit for
// bit; that matrices are Q8_0, small tensors F32, and unread tensors absent.
func TestPackServesQuantizedModel(t *testing.T) {
	for _, name := range []string{"glm5_next", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			fx, err := fixtures.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			data, err := Pack(fx.Dir, "q8_0", name, 1)
			if err != nil {
				t.Fatal(err)
			}
			g, err := gguf.FromBytes(name+".gguf", data)
			if err != nil {
				t.Fatal(err)
			}
			checkTypes(t, g)
			cfg, err := config.Parse(fx.ConfigPath(), readFile(t, fx.ConfigPath()))
			if err != nil {
				t.Fatal(err)
			}
			packed, err := engine.LoadGGUFCheckpoint("packed", cfg, g, engine.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer packed.Close()
			quant, err := engine.Load(fx.Dir, engine.Options{Threads: 1, Quant: "q8_0"})
			if err != nil {
				t.Fatal(err)
			}
			defer quant.Close()
			prompt, _, err := fx.Ints("prompt_ids")
			if err != nil {
				t.Fatal(err)
			}
			got, want := promptLogits(t, packed, prompt), promptLogits(t, quant, prompt)
			if !slices.Equal(got, want) {
				t.Error("the packed model's logits differ from the checkpoint's quantized on load")
			}
			_, gotMTP := packed.Model.(model.MTPModel)
			_, wantMTP := quant.Model.(model.MTPModel)
			if gotMTP != wantMTP {
				t.Errorf("MTP module: packed %v, checkpoint %v", gotMTP, wantMTP)
			}
		})
	}
}

// checkTypes checks the packed tensors' types and metadata.
func checkTypes(t *testing.T, g *gguf.Model) {
	t.Helper()
	if q := g.Quantization(); q != "Q8_0" {
		t.Errorf("general.file_type %q, want Q8_0", q)
	}
	if !g.KeepsCheckpointNames() {
		t.Errorf("%s is %q", gguf.TensorNamesKey, g.Meta.String(gguf.TensorNamesKey))
	}
	var q8 int
	for _, n := range g.TensorNames() {
		ti, _ := g.Tensor(n)
		switch {
		case strings.Contains(n, "visual"):
			t.Errorf("%s: the vision tower is not read, so not packed", n)
		case strings.HasSuffix(n, "norm.weight") && ti.Type != gguf.TypeF32:
			t.Errorf("%s: %s, want F32", n, ti.Type)
		case ti.Type == gguf.TypeQ8_0:
			q8++
		}
	}
	if q8 == 0 {
		t.Error("no Q8_0 tensor")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// promptLogits runs prompt through l's model in one step: every position's
// logits (vocab each).
func promptLogits(t *testing.T, l *engine.Loaded, prompt []int32) []float32 {
	t.Helper()
	m := l.Model
	c, err := l.NewCache(int64(len(prompt)+16)*m.Info().KVBytesPerToken, 16)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSeq()
	if err := c.Reserve(s, len(prompt)); err != nil {
		t.Fatal(err)
	}
	var states *linattn.StatePool
	var slot *linattn.Slot
	if sm, ok := m.(model.StateModel); ok {
		if states, err = model.NewStatePool(sm, 1<<24); err != nil {
			t.Fatal(err)
		}
		if slot, err = states.Alloc(); err != nil {
			t.Fatal(err)
		}
	}
	out, err := m.Forward(&model.Batch{Cache: c, States: states, Seqs: []model.Seq{
		{Tokens: prompt, KV: s, State: slot, Logits: model.AllLogits}}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Seqs[0].Logits
}

// TestRecorderExperts packs a fused expert stack read expert by expert and
// reads it back with Expert.
func TestRecorderExperts(t *testing.T) {
	const e, rows, cols = 3, 2, 64
	vals := make([]float32, e*rows*cols)
	for i := range vals {
		vals[i] = float32(i%17) - 8
	}
	set, err := weights.FromMemory([]weights.WriteTensor{weights.Encode("experts.down_proj", kernels.BF16, []int{e, rows, cols}, vals)})
	if err != nil {
		t.Fatal(err)
	}
	be, err := device.Open(device.Spec{Kind: device.CPU}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	q, err := engine.Quantized(set, "q8_0", be.Backend)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(q, set)
	var want [][]byte
	for x := range e {
		m, err := rec.Expert("experts.down_proj", x, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, m.Data)
	}
	if _, err := rec.Float32("experts.down_proj", e, rows, cols); err == nil {
		t.Error("reading a tensor in two forms is not an error")
	}
	tensors, err := rec.tensors()
	if err != nil {
		t.Fatal(err)
	}
	if len(tensors) != 1 || tensors[0].Type != ggufwrite.Q8_0 || !slices.Equal(tensors[0].Dims, []uint64{cols, rows, e}) {
		t.Fatalf("packed %+v", tensors)
	}
	g, err := gguf.FromBytes("experts.gguf", (&ggufwrite.Writer{Tensors: tensors}).Bytes())
	if err != nil {
		t.Fatal(err)
	}
	w := g.CheckpointWeights()
	for x := range e {
		m, err := w.Expert("experts.down_proj", x, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		if m.DType != kernels.Q8_0 || !bytes.Equal(m.Data, want[x]) {
			t.Errorf("expert %d: %v, not the quantized rows", x, m.DType)
		}
	}
}
