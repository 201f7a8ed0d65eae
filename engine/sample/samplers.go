// Package sample turns a model's logits into the next token. A Sampler is
// built once per request from Params by a clamping constructor and keeps a
// seeded PCG generator, so a fixed Seed reproduces a generation exactly.
//
// The pipeline, as pure functions in transforms.go, is
//
//	penalties (repetition, presence, frequency over the last RepeatLastN tokens)
//	→ greedy argmax if Temperature == 0, else
//	→ temperature → top-k → softmax → top-p → min-p → renormalize → draw
//
// Temperature comes before the truncations, as in Hugging Face transformers
// and ollama (llama.cpp applies it last, which changes top-p and min-p).
//
// For speculative decoding, Probs returns the final distribution and
// SampleFrom draws from any distribution with the sampler's generator.
// Sample(logits, history) ≡ SampleFrom(Probs(logits, history)): same token,
// same generator state afterwards; Sample just never builds the full vector.
//
// A row's best entries are often enough: greedy decoding needs the first,
// top-k sampling (without penalties) a few more than k. Candidates says how
// many, and SampleTop draws from them exactly what Sample would draw from
// the row, or reports that they cannot decide; so a GPU can reduce the
// logits (kernels.SampleOps) and send back a few hundred values per row.
package sample

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Params configures a Sampler. The zero value is greedy decoding with no
// penalties. New clamps every field into its valid range; the comments give
// the value that turns each stage off.
type Params struct {
	Temperature float32 // ≤ 0 (or NaN): greedy argmax
	TopP        float32 // keep the smallest set of tokens with this much mass; ≤ 0 or ≥ 1: off
	MinP        float32 // drop tokens below MinP × the top probability; ≤ 0: off, capped at 1
	TopK        int     // keep the TopK most likely tokens; ≤ 0: off

	RepeatPenalty    float32 // divide positive (multiply negative) logits of recent tokens; ≤ 0 or 1: off
	PresencePenalty  float32 // subtract from recent tokens' logits once; 0: off; clamped to [-2, 2]
	FrequencyPenalty float32 // subtract per occurrence in the window; 0: off; clamped to [-2, 2]
	RepeatLastN      int     // window of history the penalties look at; 0: 64; < 0: all of it

	Seed uint64 // generator seed; 0: a random seed (see Sampler.Seed)
}

// defaultRepeatLastN is the penalty window when Params.RepeatLastN is 0, as
// in llama.cpp and ollama.
const defaultRepeatLastN = 64

// Sampler draws tokens from logits. It is not safe for concurrent use; give
// each sequence its own. Its buffers are reused across calls, so sampling
// allocates nothing once they have grown to the vocabulary size.
type Sampler struct {
	p    Params
	seed uint64
	rng  *rand.Rand

	logits []float32 // (vocab) penalized copy of the logits, when penalties are on
	tokens []token   // (vocab) candidates
	ids    []int32   // (window) scratch for counting repeats
}

// New returns a Sampler for p, its fields clamped into range.
func New(p Params) *Sampler {
	nan := func(f float32) bool { return f != f }
	if nan(p.Temperature) || p.Temperature < 0 {
		p.Temperature = 0
	}
	if nan(p.TopP) || p.TopP <= 0 || p.TopP >= 1 {
		p.TopP = 1
	}
	if nan(p.MinP) || p.MinP < 0 {
		p.MinP = 0
	}
	p.MinP = min(p.MinP, 1)
	p.TopK = max(p.TopK, 0)
	if nan(p.RepeatPenalty) || p.RepeatPenalty <= 0 {
		p.RepeatPenalty = 1
	}
	clamp2 := func(f float32) float32 {
		if nan(f) {
			return 0
		}
		return min(max(f, -2), 2)
	}
	p.PresencePenalty = clamp2(p.PresencePenalty)
	p.FrequencyPenalty = clamp2(p.FrequencyPenalty)
	if p.RepeatLastN == 0 {
		p.RepeatLastN = defaultRepeatLastN
	}
	seed := p.Seed
	for seed == 0 {
		seed = rand.Uint64()
	}
	return &Sampler{p: p, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Params returns the clamped parameters.
func (s *Sampler) Params() Params { return s.p }

// Seed returns the seed in use: Params.Seed, or the random one drawn for a
// zero Seed, so that any generation can be replayed.
func (s *Sampler) Seed() uint64 { return s.seed }

// Uniform returns a uniform draw in [0, 1) from the sampler's generator, as
// speculative decoding's acceptance test needs.
func (s *Sampler) Uniform() float32 { return s.rng.Float32() }

// Sample returns the next token for logits (vocab) given the tokens so far
// (prompt and output, oldest first; only the last RepeatLastN matter). NaN
// logits count as -Inf. Greedy decoding returns the highest logit, ties to
// the lowest id. If no logit is above -Inf it returns 0. It panics if logits
// is empty.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	return s.draw(s.dist(logits, history))
}

// draw picks a token from the kept tokens ts (id order), consuming one
// generator draw unless at most one has a positive probability.
func (s *Sampler) draw(ts []token) int32 {
	var total float64
	positive, last := 0, int32(0)
	for _, t := range ts {
		if t.v > 0 {
			total += float64(t.v)
			positive++
			last = t.id
		}
	}
	if positive <= 1 {
		return last
	}
	target := s.rng.Float64() * total
	var cum float64
	for _, t := range ts {
		if t.v > 0 {
			if cum += float64(t.v); cum > target {
				return t.id
			}
		}
	}
	return last // rounding left target at the very top
}

// MaxCandidates bounds Candidates: top-k sampling from a row's best
// entries works for TopK < MaxCandidates.
const MaxCandidates = 256

// Candidates is how many of a logit row's best entries SampleTop needs to
// draw exactly what Sample would draw from the whole row: 1 for greedy
// decoding, TopK+1 for top-k sampling; 0 when it needs the row (penalties,
// which change any logit of the history; sampling without top-k, whose
// softmax sums the whole vocabulary; TopK ≥ MaxCandidates).
func (s *Sampler) Candidates() int {
	p := &s.p
	switch {
	case p.RepeatPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0:
		return 0
	case p.Temperature == 0:
		return 1
	case p.TopK > 0 && p.TopK < MaxCandidates:
		return p.TopK + 1
	}
	return 0
}

// SampleTop is Sample from a row's best entries rather than the row: vals
// and ids are the len(vals) best logits of a row of vocab and their ids,
// best first (larger value, ties to the lower id, NaN as -Inf), as
// kernels.SampleOps.TopKRows returns them, with len(vals) ≥ Candidates()
// or = vocab. It returns Sample's token, leaving the generator in
// Sample's state, and true; or false, having consumed nothing, when the
// entries cannot decide: fewer than Candidates(), or a temperature that
// may round the worst kept logit and one left out to the same value (a
// tie the lower id wins, and the entries cannot show every id). Then
// the caller samples the row. Only long runs of equal or nearly equal
// logits around the cut do that: give it more entries than it needs.
func (s *Sampler) SampleTop(vals []float32, ids []int32, vocab int) (int32, bool) {
	K, need := len(vals), s.Candidates()
	if need == 0 || K < need && K != vocab || K == 0 || len(ids) != K {
		return 0, false
	}
	negInf := float32(math.Inf(-1))
	if s.p.Temperature == 0 {
		if !(vals[0] > negInf) {
			return 0, true // Sample's answer when no logit is above -Inf
		}
		return ids[0], true
	}
	ts := s.tokens[:0]
	for i, v := range vals {
		if v > negInf {
			ts = append(ts, token{id: ids[i], v: v})
		}
	}
	s.tokens = ts
	if len(ts) < K || K == vocab {
		// Every logit of the row above -Inf is here: the same candidates
		// as Sample's, once in id order.
		if len(ts) == 0 {
			return 0, true
		}
		slices.SortFunc(ts, func(a, b token) int { return int(a.id) - int(b.id) })
		return s.draw(s.truncate(ts)), true
	}
	// More than K tokens are above -Inf, so top-k applies (TopK < K). A
	// token left out has a logit below the K-th's, vK, hence (temper is
	// monotone) a value at most that of the float just below vK; or vK
	// itself and a higher id than every entry here with vK (ties went to
	// the lower id). When both kinds lose to the worst kept token, no
	// token left out could have been kept.
	m, vK, maxID := ts[0].v, ts[K-1].v, int32(-1)
	for _, t := range ts {
		if t.v == vK {
			maxID = max(maxID, t.id)
		}
	}
	below := temper(math.Nextafter32(vK, negInf), m, s.p.Temperature)
	temperature(ts, s.p.Temperature)
	tK := ts[K-1].v
	ts = topK(ts, s.p.TopK)
	last := ts[len(ts)-1]
	if !(below < last.v && (tK < last.v || tK == last.v && last.id <= maxID)) {
		return 0, false
	}
	return s.draw(s.finish(ts, true)), true
}

// Probs returns, in a new slice of len(logits), the distribution Sample
// draws from: the probabilities after every transform, zero outside the
// kept tokens; one-hot for greedy decoding (and at id 0 if no logit is
// above -Inf).
func (s *Sampler) Probs(logits []float32, history []int32) []float32 {
	out := make([]float32, len(logits))
	for _, t := range s.dist(logits, history) {
		out[t.id] = t.v
	}
	return out
}

// SampleFrom draws a token from probs (any non-negative weights; NaN and
// negative entries count as 0) with the sampler's generator. It consumes one
// draw unless at most one entry is positive; then it returns that entry's
// id, or 0 if there is none.
//
// Its walk is Sample's, step for step: both add the positive weights in
// increasing id order in float64 and return the first id where the running
// total exceeds u × total, so equal distributions and generator states give
// equal tokens.
func (s *Sampler) SampleFrom(probs []float32) int32 {
	var total float64
	positive, last := 0, int32(0)
	for i, v := range probs {
		if v > 0 {
			total += float64(v)
			positive++
			last = int32(i)
		}
	}
	if positive <= 1 {
		return last
	}
	target := s.rng.Float64() * total
	var cum float64
	for i, v := range probs {
		if v > 0 {
			if cum += float64(v); cum > target {
				return int32(i)
			}
		}
	}
	return last
}

// dist runs the pipeline and returns the kept tokens with their final
// probabilities, in increasing id order. The result aliases s.tokens.
func (s *Sampler) dist(logits []float32, history []int32) []token {
	if len(logits) == 0 {
		panic("sample: empty logits")
	}
	p := &s.p
	// NaN needs no pass of its own: every comparison below is false for
	// it, so it is never the argmax and never a candidate.
	l := logits
	if p.RepeatPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		s.logits = append(s.logits[:0], logits...)
		l = s.logits
		window := history
		if p.RepeatLastN > 0 && len(window) > p.RepeatLastN {
			window = window[len(window)-p.RepeatLastN:]
		}
		s.ids = penalize(l, window, s.ids, p.RepeatPenalty, p.PresencePenalty, p.FrequencyPenalty)
	}

	ts := s.tokens[:0]
	if p.Temperature == 0 {
		best := token{id: 0, v: float32(math.Inf(-1))}
		for i, v := range l {
			if v > best.v {
				best = token{id: int32(i), v: v}
			}
		}
		s.tokens = append(ts, token{id: best.id, v: 1})
		return s.tokens
	}
	negInf := float32(math.Inf(-1))
	for i, v := range l {
		if v > negInf {
			ts = append(ts, token{id: int32(i), v: v})
		}
	}
	s.tokens = ts
	if len(ts) == 0 {
		s.tokens = append(ts, token{id: 0, v: 1})
		return s.tokens
	}

	return s.truncate(ts)
}

// truncate runs temperature → top-k → softmax → top-p → min-p →
// renormalise over ts, the logits above -Inf in id order, and returns the
// kept tokens with their probabilities in id order.
func (s *Sampler) truncate(ts []token) []token {
	temperature(ts, s.p.Temperature)
	sorted := false
	if s.p.TopK > 0 && s.p.TopK < len(ts) {
		ts = topK(ts, s.p.TopK)
		sorted = true
	}
	return s.finish(ts, sorted)
}

// finish runs softmax → top-p → min-p → renormalise over ts (tempered
// logits, in id order or, when sorted, best first) and returns the kept
// tokens in id order.
func (s *Sampler) finish(ts []token, sorted bool) []token {
	p := &s.p
	softmax(ts)
	n := len(ts)
	if p.TopP < 1 {
		ts = topP(ts, p.TopP)
		sorted = true
	}
	if p.MinP > 0 {
		ts = minP(ts, p.MinP)
	}
	if len(ts) < n {
		normalize(ts)
	}
	if sorted {
		slices.SortFunc(ts, func(a, b token) int { return int(a.id) - int(b.id) })
	}
	return ts
}
