package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestNewClamps(t *testing.T) {
	nan := float32(math.NaN())
	got := New(Params{Temperature: -1, TopP: 1.5, MinP: 3, TopK: -4, RepeatPenalty: -1,
		PresencePenalty: 9, FrequencyPenalty: nan, Seed: 7}).Params()
	want := Params{Temperature: 0, TopP: 1, MinP: 1, TopK: 0, RepeatPenalty: 1,
		PresencePenalty: 2, FrequencyPenalty: 0, RepeatLastN: 64, Seed: 7}
	if got != want {
		t.Errorf("New clamped to %+v, want %+v", got, want)
	}
	got = New(Params{Temperature: nan, TopP: nan, MinP: nan, RepeatPenalty: nan, RepeatLastN: -1}).Params()
	if got.Temperature != 0 || got.TopP != 1 || got.MinP != 0 || got.RepeatPenalty != 1 || got.RepeatLastN != -1 {
		t.Errorf("NaN params clamped to %+v", got)
	}
	if s := New(Params{}); s.Seed() == 0 {
		t.Error("a zero Seed must draw a random non-zero seed")
	}
}

func TestGreedy(t *testing.T) {
	s := New(Params{})
	cases := []struct {
		logits []float32
		want   int32
	}{
		{[]float32{1, 3, 2}, 1},
		{[]float32{3, 1, 3}, 0}, // ties to the lowest id
		{[]float32{-inf, -inf, 2, -inf}, 2},
		{[]float32{float32(math.NaN()), 1, float32(math.NaN())}, 1},
		{[]float32{-inf, -inf}, 0},
		{[]float32{float32(math.NaN()), float32(math.NaN())}, 0},
		{[]float32{1, inf, 2}, 1},
	}
	for _, c := range cases {
		if got := s.Sample(c.logits, nil); got != c.want {
			t.Errorf("greedy %v = %d, want %d", c.logits, got, c.want)
		}
		p := s.Probs(c.logits, nil)
		want := make([]float32, len(c.logits))
		want[c.want] = 1
		if !slices.Equal(p, want) {
			t.Errorf("greedy Probs(%v) = %v, want one-hot %v", c.logits, p, want)
		}
	}
}

func TestGreedyPenalized(t *testing.T) {
	s := New(Params{RepeatPenalty: 2})
	// Token 1 leads but was just said: 4/2 = 2 < 3.
	if got := s.Sample([]float32{1, 4, 3}, []int32{1}); got != 2 {
		t.Errorf("got %d, want 2", got)
	}
	// Outside the window it is not penalized.
	s = New(Params{RepeatPenalty: 2, RepeatLastN: 2})
	if got := s.Sample([]float32{1, 4, 3}, []int32{1, 0, 0}); got != 1 {
		t.Errorf("got %d, want 1", got)
	}
	// RepeatLastN < 0 looks at the whole history.
	s = New(Params{RepeatPenalty: 2, RepeatLastN: -1})
	if got := s.Sample([]float32{1, 4, 3}, append([]int32{1}, make([]int32, 100)...)); got != 2 {
		t.Errorf("got %d, want 2", got)
	}
}

func TestProbs(t *testing.T) {
	l3 := float32(math.Log(3))
	cases := []struct {
		name   string
		p      Params
		logits []float32
		want   []float32
	}{
		{"plain", Params{Temperature: 1}, []float32{0, l3, -inf}, []float32{0.25, 0.75, 0}},
		{"temperature", Params{Temperature: 0.5}, []float32{0, l3 / 2}, []float32{0.25, 0.75}},
		{"top-k", Params{Temperature: 1, TopK: 2}, []float32{0, 0, l3, -1}, []float32{0.25, 0, 0.75, 0}},
		{"top-k > vocab", Params{Temperature: 1, TopK: 10}, []float32{0, l3}, []float32{0.25, 0.75}},
		{"top-p", Params{Temperature: 1, TopP: 0.55}, []float32{0, l3, 0, -inf}, []float32{0, 1, 0, 0}},
		{"top-p tie to lower id", Params{Temperature: 1, TopP: 0.7}, []float32{0, l3, 0, -inf}, []float32{0.25, 0.75, 0, 0}},
		{"top-p two", Params{Temperature: 1, TopP: 0.7}, []float32{0, l3 + 0.1, l3, -inf}, []float32{0, 0.5249792, 0.4750208, 0}},
		{"top-p 1 is off", Params{Temperature: 1, TopP: 1}, []float32{0, l3}, []float32{0.25, 0.75}},
		{"min-p", Params{Temperature: 1, MinP: 0.5}, []float32{0, l3, l3 - 0.5}, []float32{0, 0.6224593, 0.3775407}},
		{"min-p 0 is off", Params{Temperature: 1, MinP: 0}, []float32{0, l3}, []float32{0.25, 0.75}},
		{"one finite", Params{Temperature: 1}, []float32{-inf, -inf, 5, -inf}, []float32{0, 0, 1, 0}},
		{"NaN dropped", Params{Temperature: 1}, []float32{0, float32(math.NaN()), l3}, []float32{0.25, 0, 0.75}},
		{"all -Inf", Params{Temperature: 1}, []float32{-inf, -inf}, []float32{1, 0}},
		{"+Inf wins", Params{Temperature: 1}, []float32{inf, 100, inf}, []float32{0.5, 0, 0.5}},
		{"tiny temperature is greedy", Params{Temperature: 1e-30}, []float32{1, 2, 1.5}, []float32{0, 1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := New(c.p).Probs(c.logits, nil)
			if !near(got, c.want, 1e-6) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestSeedReproducible(t *testing.T) {
	p := Params{Temperature: 1, TopK: 50, TopP: 0.95, Seed: 42}
	rng := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	run := func(p Params) []int32 {
		s := New(p)
		var out []int32
		for range 200 {
			out = append(out, s.Sample(logits, out))
		}
		return out
	}
	a, b := run(p), run(p)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different samples")
	}
	p.Seed = 43
	if slices.Equal(a, run(p)) {
		t.Fatal("different seeds, same 200 samples")
	}
	// A random seed is reported and replays.
	s := New(Params{Temperature: 1})
	p = s.Params()
	p.Seed = s.Seed()
	x, y := New(p), s
	for range 50 {
		if x.Sample(logits, nil) != y.Sample(logits, nil) {
			t.Fatal("replaying Seed() gave different samples")
		}
	}
}

// TestSampleIsSampleFromProbs checks Sample ≡ SampleFrom(Probs(...)):
// equal tokens and equal generator states after, for every stage.
func TestSampleIsSampleFromProbs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, p := range []Params{
		{Temperature: 0.8},
		{Temperature: 1, TopK: 5},
		{Temperature: 1.3, TopP: 0.9},
		{Temperature: 0.7, MinP: 0.1},
		{Temperature: 1, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.1},
		{Temperature: 0, RepeatPenalty: 1.1},
	} {
		p.Seed = 99
		a, b := New(p), New(p)
		var hist []int32
		for range 300 {
			logits := make([]float32, 64)
			for i := range logits {
				logits[i] = float32(rng.NormFloat64() * 3)
			}
			ta := a.Sample(logits, hist)
			tb := b.SampleFrom(b.Probs(logits, hist))
			if ta != tb {
				t.Fatalf("%+v: Sample = %d, SampleFrom(Probs) = %d", p, ta, tb)
			}
			hist = append(hist, ta)
		}
		if a.Uniform() != b.Uniform() {
			t.Fatalf("%+v: generators diverged", p)
		}
	}
}

// TestSampleFollowsProbs is a chi-square goodness-of-fit test of Sample
// against Probs on a small vocabulary (fixed seed, so it is deterministic).
func TestSampleFollowsProbs(t *testing.T) {
	logits := []float32{1, 2, 0.5, -1, 3, 2.5, -inf, 0}
	s := New(Params{Temperature: 0.9, TopK: 6, Seed: 5})
	probs := s.Probs(logits, nil)
	const draws = 60000
	counts := make([]int, len(logits))
	for range draws {
		counts[s.Sample(logits, nil)]++
	}
	var chi2 float64
	df := -1
	for i, p := range probs {
		if p == 0 {
			if counts[i] != 0 {
				t.Fatalf("token %d has probability 0 but was drawn %d times", i, counts[i])
			}
			continue
		}
		e := float64(p) * draws
		chi2 += (float64(counts[i]) - e) * (float64(counts[i]) - e) / e
		df++
	}
	// 99.9th percentile of chi-square with 5 degrees of freedom.
	if df != 5 || chi2 > 20.52 {
		t.Errorf("chi2 = %.2f with %d degrees of freedom; counts %v, probs %v", chi2, df, counts, probs)
	}
}

func TestSampleFrom(t *testing.T) {
	s := New(Params{Seed: 1})
	if got := s.SampleFrom([]float32{0, 0, 3, 0}); got != 2 {
		t.Errorf("single positive entry: got %d, want 2", got)
	}
	if got := s.SampleFrom([]float32{0, -1, float32(math.NaN())}); got != 0 {
		t.Errorf("no positive entry: got %d, want 0", got)
	}
	// Unnormalized weights work: 1:3.
	n := 0
	for range 4000 {
		if s.SampleFrom([]float32{1, 0, 3}) == 2 {
			n++
		}
	}
	if n < 2850 || n > 3150 {
		t.Errorf("weight 3 of 4 drawn %d/4000 times", n)
	}
	if u := s.Uniform(); u < 0 || u >= 1 {
		t.Errorf("Uniform() = %g", u)
	}
}

func TestEmptyLogitsPanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "sample: empty logits" {
			t.Errorf("recovered %v", r)
		}
	}()
	New(Params{}).Sample(nil, nil)
}

func TestSampleAllocs(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(i % 17)
	}
	hist := []int32{1, 2, 3, 2}
	s := New(Params{Temperature: 0.8, TopK: 40, TopP: 0.9, MinP: 0.01, RepeatPenalty: 1.1, Seed: 1})
	s.Sample(logits, hist)
	if n := testing.AllocsPerRun(20, func() { s.Sample(logits, hist) }); n != 0 {
		t.Errorf("Sample allocates %v times per call", n)
	}
}
