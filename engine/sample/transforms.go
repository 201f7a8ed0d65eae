package sample

import (
	"cmp"
	"math"
	"slices"
)

// token is a sampling candidate: a vocabulary id and its current value, a
// logit before softmax and a probability after.
type token struct {
	id int32
	v  float32
}

// better orders tokens best first: higher value, then lower id, so every
// tie is broken the same way.
func better(a, b token) bool { return a.v > b.v || a.v == b.v && a.id < b.id }

func cmpBetter(a, b token) int {
	if c := cmp.Compare(b.v, a.v); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

// penalize applies the repetition, presence and frequency penalties in
// place to the logits of the tokens in window (the recent history; ids out
// of range are ignored). For each distinct token t seen c times:
//
//	if logits[t] > 0 { logits[t] /= repeat } else { logits[t] *= repeat }  // HF / llama.cpp
//	logits[t] -= presence + frequency*c                                    // OpenAI
//
// scratch is reused to count (grown if needed) and returned.
func penalize(logits []float32, window []int32, scratch []int32, repeat, presence, frequency float32) []int32 {
	ids := append(scratch[:0], window...)
	slices.Sort(ids)
	for i := 0; i < len(ids); {
		t := ids[i]
		j := i + 1
		for j < len(ids) && ids[j] == t {
			j++
		}
		c := j - i
		i = j
		if t < 0 || int(t) >= len(logits) {
			continue
		}
		l := logits[t]
		if l > 0 {
			l /= repeat
		} else {
			l *= repeat
		}
		logits[t] = l - presence - frequency*float32(c)
	}
	return ids
}

// temperature sets every logit to (logit − max)/t, t > 0. Subtracting the
// maximum first changes neither the ordering nor the softmax, and keeps a
// tiny t from overflowing every logit to ±Inf (which would make them tie).
// If the maximum is +Inf the logits are left alone: softmax shares the mass
// among the +Inf tokens at any temperature.
func temperature(ts []token, t float32) {
	m := float32(math.Inf(-1))
	for _, tk := range ts {
		m = max(m, tk.v)
	}
	if math.IsInf(float64(m), 1) {
		return
	}
	for i := range ts {
		ts[i].v = temper(ts[i].v, m, t)
	}
}

// temper is logit v after temperature t when the largest logit is m: what
// temperature sets it to. It is monotone in v.
func temper(v, m, t float32) float32 {
	if math.IsInf(float64(m), 1) {
		return v
	}
	return (v - m) / t
}

// topK moves the k best tokens (by value, ties to the lower id) to the front
// of ts, sorted best first, and returns them; 0 < k < len(ts). It keeps a
// min-heap of the best k seen so far, so most tokens cost one comparison.
func topK(ts []token, k int) []token {
	h := ts[:k]
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	for _, t := range ts[k:] {
		if better(t, h[0]) {
			h[0] = t
			siftDown(h, 0)
		}
	}
	slices.SortFunc(h, cmpBetter)
	return h
}

// siftDown restores the heap order below i of a heap whose root is the
// worst token.
func siftDown(h []token, i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && better(h[c], h[c+1]) {
			c++
		}
		if !better(h[i], h[c]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// softmax turns the logits of ts into probabilities summing to 1,
// subtracting the maximum first. If some logits are +Inf, they share the
// mass equally. ts must be non-empty and hold no NaN.
func softmax(ts []token) {
	m := float32(math.Inf(-1))
	for _, t := range ts {
		m = max(m, t.v)
	}
	if math.IsInf(float64(m), 1) {
		for i := range ts {
			if math.IsInf(float64(ts[i].v), 1) {
				ts[i].v = 1
			} else {
				ts[i].v = 0
			}
		}
		normalize(ts)
		return
	}
	var sum float64
	for i := range ts {
		e := exp32(ts[i].v - m)
		ts[i].v = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range ts {
		ts[i].v *= inv
	}
}

// topP keeps the nucleus: the fewest most probable tokens whose
// probabilities add up to at least p (at least one token), sorted best
// first, at the front of ts. ts holds probabilities in any order; 0 < p < 1.
//
// Only tokens with probability ≥ (1−p)/len(ts) can be in the nucleus (the
// others hold less than 1−p together), so only those are sorted.
func topP(ts []token, p float32) []token {
	eps := (1 - p) / float32(len(ts))
	n := 0
	for i, t := range ts {
		if t.v >= eps {
			ts[n], ts[i] = ts[i], ts[n]
			n++
		}
	}
	head := ts[:n]
	if n == 0 { // rounding; cannot happen with a normalized input
		head = ts
	}
	slices.SortFunc(head, cmpBetter)
	var cum float64
	for i, t := range head {
		cum += float64(t.v)
		if cum >= float64(p) {
			return head[:i+1]
		}
	}
	return head
}

// minP keeps the tokens whose probability is at least p times the largest,
// in their current order; 0 < p ≤ 1.
func minP(ts []token, p float32) []token {
	var m float32
	for _, t := range ts {
		m = max(m, t.v)
	}
	cut := p * m
	kept := ts[:0]
	for _, t := range ts {
		if t.v >= cut {
			kept = append(kept, t)
		}
	}
	return kept
}

// normalize scales the values of ts to sum to 1. The sum must be positive.
func normalize(ts []token) {
	var sum float64
	for _, t := range ts {
		sum += float64(t.v)
	}
	inv := float32(1 / sum)
	for i := range ts {
		ts[i].v *= inv
	}
}
