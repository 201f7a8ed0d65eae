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
	r0, _ := pool.NewSnapshot()
	r1, _ := pool.NewSnapshot()
	toks := func(n int) []int32 { return make([]int32, n) }
	recs := func(n int, at map[int]*linattn.Snapshot) []*linattn.Snapshot {
		r := make([]*linattn.Snapshot, n)
		for i, s := range at {
			r[i] = s
		}
		return r
	}
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
		{"records", Batch{States: pool, Seqs: []Seq{{State: a, Tokens: toks(3), Record: recs(3, map[int]*linattn.Snapshot{0: r0, 1: r1})}, {State: b, Tokens: toks(9)}}}, ""},
		{"record length", Batch{States: pool, Seqs: []Seq{{State: a, Tokens: toks(3), Record: recs(2, nil)}}}, "records 2 states for 3 tokens"},
		{"long record", Batch{States: pool, Seqs: []Seq{{State: a, Tokens: toks(9), Record: recs(9, nil)}}}, "at most 8"},
		{"shared record", Batch{States: pool, Seqs: []Seq{{State: a, Tokens: toks(1), Record: recs(1, map[int]*linattn.Snapshot{0: r0})},
			{State: b, Tokens: toks(2), Record: recs(2, map[int]*linattn.Snapshot{1: r0})}}}, "sequence 1 repeats a record snapshot"},
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
