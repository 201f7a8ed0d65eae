package model

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

func TestValidateStates(t *testing.T) {
	layout := []linattn.LayerShape{{Heads: 2, DK: 4, DV: 4, ConvK: 4, ConvChannels: 24}}
	dev := strict.New()
	pool, err := linattn.NewStatePool(dev, layout, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	other, err := linattn.NewStatePool(dev, append(layout, layout[0]), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := pool.Alloc()
	b, _ := pool.Alloc()
	cases := []struct {
		name  string
		batch Batch
		want  string
	}{
		{"ok", Batch{States: pool, Seqs: []Seq{{State: a}, {State: b}}}, ""},
		{"no pool", Batch{Seqs: []Seq{{State: a}}}, "no state pool"},
		{"wrong pool", Batch{States: other, Seqs: []Seq{{State: a}}}, "the model needs 1 layers"},
		{"no slot", Batch{States: pool, Seqs: []Seq{{State: a}, {}}}, "sequence 1 has no state slot"},
		{"shared slot", Batch{States: pool, Seqs: []Seq{{State: a}, {State: a}}}, "sequence 1 repeats a state slot"},
	}
	for _, c := range cases {
		err := c.batch.ValidateStates(layout)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	if err := (&Batch{}).ValidateStates(nil); err != nil {
		t.Errorf("a model without linear layers needs no pool: %v", err)
	}
}
