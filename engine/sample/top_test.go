package sample

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// topRow is a row's k best entries as kernels.SampleOps.TopKRows returns
// them (the reference).
func topRow(row []float32, k int) ([]float32, []int32) {
	vals, ids := make([]float32, k), make([]int32, k)
	ref.TopKRow(vals, ids, row)
	return vals, ids
}

// testRow is a logit row of kind: normals, normals rounded to bfloat16
// (ties), few distinct values, or seasoned with NaN, ±Inf and ±0.
func testRow(rng *rand.Rand, n, kind int) []float32 {
	row := make([]float32, n)
	for j := range row {
		v := float32(rng.NormFloat64() * 3)
		switch kind % 5 {
		case 1:
			v = kernels.BF16ToF32(kernels.F32ToBF16(v))
		case 2:
			v = float32(rng.IntN(6)) / 2
		case 3:
			switch rng.IntN(20) {
			case 0:
				v = float32(math.NaN())
			case 1, 2, 3:
				v = -inf
			case 4:
				v = float32(math.Copysign(0, -1))
			case 5:
				v = 0
			}
		case 4:
			if rng.IntN(3) > 0 {
				v = -inf // fewer finite logits than some k
			}
			if rng.IntN(200) == 0 {
				v = inf
			}
		}
		row[j] = v
	}
	return row
}

// TestSampleTopMatchesSample draws with Sample from whole rows and with
// SampleTop from their best entries, with twin samplers (same seed), over
// many rows and parameters: every token must agree, and so must the
// generators afterwards. Undecided rows (SampleTop false) must be rare and
// must leave the generator untouched.
func TestSampleTopMatchesSample(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	params := []Params{
		{},
		{Temperature: 0.7, TopK: 40},
		{Temperature: 1, TopK: 1},
		{Temperature: 0.3, TopK: 5, TopP: 0.9},
		{Temperature: 1.5, TopK: 20, MinP: 0.05},
		{Temperature: 1e-3, TopK: 3},
		{Temperature: 3, TopK: 255, TopP: 0.95, MinP: 0.01},
		{Temperature: 0.8, TopK: 300}, // above MaxCandidates: the row
		{Temperature: 0.8, TopP: 0.9}, // no top-k: the row
		{RepeatPenalty: 1.3},          // penalties: the row
	}
	vocabs := []int{1, 3, 40, 257, 1000}
	rows, undecided := 0, 0
	for pi, p := range params {
		for _, vocab := range vocabs {
			for kind := range 10 {
				p.Seed = uint64(1000*pi + 10*vocab + kind + 1)
				a, b := New(p), New(p)
				need := a.Candidates()
				if need == 0 {
					if p.TopK < MaxCandidates && p.RepeatPenalty <= 1 && p.TopP == 0 {
						t.Fatalf("%+v: Candidates 0", p)
					}
					continue
				}
				k := min(need+rng.IntN(3), vocab) // at least what it asks for, or the whole row
				for range 8 {
					row := testRow(rng, vocab, kind)
					vals, ids := topRow(row, k)
					want := a.Sample(row, nil)
					got, ok := b.SampleTop(vals, ids, vocab)
					rows++
					if !ok {
						undecided++
						got = b.Sample(row, nil) // what the runtime does
					}
					if got != want {
						t.Fatalf("%+v vocab %d kind %d k %d: SampleTop %d, Sample %d\nrow %v", p, vocab, kind, k, got, want, row)
					}
				}
				if x, y := a.Uniform(), b.Uniform(); x != y {
					t.Fatalf("%+v vocab %d kind %d: the generators diverged", p, vocab, kind)
				}
			}
		}
	}
	t.Logf("%d rows, %d undecided", rows, undecided)
}

// TestSampleTopDecides: with MaxCandidates entries, as the runtime asks
// for, rows of distinct or bfloat16-rounded logits are always decided.
func TestSampleTopDecides(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, p := range []Params{{Temperature: 0.7, TopK: 40}, {Temperature: 2, TopK: 200, TopP: 0.9}, {Temperature: 0.1, TopK: 1}} {
		s := New(p)
		for i := range 40 {
			row := testRow(rng, 2000, i%2)
			vals, ids := topRow(row, MaxCandidates)
			if _, ok := s.SampleTop(vals, ids, len(row)); !ok {
				t.Fatalf("%+v: row %d undecided", p, i)
			}
		}
	}
}

// TestSampleTopUndecided: a large temperature rounds nearby logits to the
// same value, and a tie goes to the lower id, which may be left out of the
// entries: SampleTop must say so rather than guess, and consume nothing.
func TestSampleTopUndecided(t *testing.T) {
	// Three consecutive floats a < b < c that temper to one value.
	const temp, m = 100, 5
	a := float32(1)
	for ; a < 2; a = math.Nextafter32(a, 2) {
		b := math.Nextafter32(a, 2)
		c := math.Nextafter32(b, 2)
		if temper(a, m, temp) == temper(c, m, temp) {
			break
		}
	}
	b := math.Nextafter32(a, 2)
	c := math.Nextafter32(b, 2)
	// Top-2 keeps 5 and, of the three tied values, the lowest id: a (id 0).
	row := []float32{a, m, b, c}
	p := Params{Temperature: temp, TopK: 2, Seed: 9}
	if want := New(p).Probs(row, nil); want[0] == 0 || want[2] != 0 || want[3] != 0 {
		t.Fatalf("full-row distribution %v: the tie should keep id 0", want)
	}
	s := New(p)
	vals, ids := topRow(row, 3) // 5, c, b: a is left out
	if _, ok := s.SampleTop(vals, ids, len(row)); ok {
		t.Fatal("SampleTop decided a tie it cannot see")
	}
	if s.Uniform() != New(p).Uniform() {
		t.Fatal("an undecided SampleTop consumed a draw")
	}
	// With a in the entries it decides, as Sample does.
	vals, ids = topRow(row, 4)
	want := New(p).Sample(row, nil)
	if got, ok := New(p).SampleTop(vals, ids, len(row)); !ok || got != want {
		t.Errorf("SampleTop over the whole row = %d, %v; Sample %d", got, ok, want)
	}
	// Too few entries, and a sampler that needs the row.
	if _, ok := New(Params{Temperature: 1, TopK: 4}).SampleTop(vals[:3], ids[:3], 10); ok {
		t.Error("SampleTop with fewer entries than Candidates")
	}
	if _, ok := New(Params{Temperature: 1}).SampleTop(vals, ids, 10); ok {
		t.Error("SampleTop without top-k")
	}
}

func TestCandidates(t *testing.T) {
	for _, c := range []struct {
		p    Params
		want int
	}{
		{Params{}, 1},
		{Params{Temperature: 1, TopK: 40}, 41},
		{Params{Temperature: 1, TopK: MaxCandidates - 1}, MaxCandidates},
		{Params{Temperature: 1, TopK: MaxCandidates}, 0},
		{Params{Temperature: 1}, 0},
		{Params{RepeatPenalty: 1.1}, 0},
		{Params{Temperature: 1, TopK: 4, PresencePenalty: 0.5}, 0},
	} {
		if got := New(c.p).Candidates(); got != c.want {
			t.Errorf("Candidates(%+v) = %d, want %d", c.p, got, c.want)
		}
	}
}
