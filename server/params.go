package server

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// maxChoices is the most completions (n) one request may ask for, as /regen
// in the chat allows.
const maxChoices = 8

// maxStops is the most stop strings one request may give.
const maxStops = 16

// zeroSeed stands for seed 0, which the sampler would take as "draw a
// random seed": a client that sends seed 0 wants a reproducible run.
const zeroSeed = 0x9e3779b97f4a7c15

// genParams are a request's generation parameters, checked.
type genParams struct {
	maxTokens    int  // 0: until the context is full
	explicitMax  bool // max_tokens or max_completion_tokens was given
	sampling     sample.Params
	seeded       bool // seed was given: choice i uses seed + i
	stops        []string
	n            int
	stream       bool
	includeUsage bool
}

// params checks the sampling fields of r. defaultMax is the max_tokens of a
// request without one (0: until the context is full).
func (r *samplingRequest) params(defaultMax int) (genParams, *apiError) {
	p := genParams{
		maxTokens: defaultMax,
		n:         1,
		stream:    r.Stream,
		// OpenAI's defaults: sample the whole distribution at temperature 1.
		sampling: sample.Params{Temperature: 1, TopP: 1, RepeatPenalty: 1},
	}
	if r.StreamOptions != nil {
		if !r.Stream {
			return p, paramError("stream_options", "stream_options is only allowed with stream: true")
		}
		p.includeUsage = r.StreamOptions.IncludeUsage
	}
	maxTok := r.MaxCompletionTokens
	name := "max_completion_tokens"
	if maxTok == nil {
		maxTok, name = r.MaxTokens, "max_tokens"
	}
	if maxTok != nil {
		if *maxTok < 1 {
			return p, paramError(name, fmt.Sprintf("%s is %d: want at least 1", name, *maxTok))
		}
		p.maxTokens, p.explicitMax = *maxTok, true
	}
	if err := checkRange(r.Temperature, "temperature", 0, 2, &p.sampling.Temperature); err != nil {
		return p, err
	}
	if r.TopP != nil && !(*r.TopP > 0 && *r.TopP <= 1) {
		return p, paramError("top_p", fmt.Sprintf("top_p is %g: want more than 0 and at most 1", *r.TopP))
	}
	if r.TopP != nil {
		p.sampling.TopP = float32(*r.TopP)
	}
	if err := checkRange(r.MinP, "min_p", 0, 1, &p.sampling.MinP); err != nil {
		return p, err
	}
	if err := checkRange(r.PresencePenalty, "presence_penalty", -2, 2, &p.sampling.PresencePenalty); err != nil {
		return p, err
	}
	if err := checkRange(r.FrequencyPenalty, "frequency_penalty", -2, 2, &p.sampling.FrequencyPenalty); err != nil {
		return p, err
	}
	if v := r.RepetitionPenalty; v != nil {
		if !(*v > 0 && *v <= 10) {
			return p, paramError("repetition_penalty", fmt.Sprintf("repetition_penalty is %g: want more than 0 and at most 10 (1 = off)", *v))
		}
		p.sampling.RepeatPenalty = float32(*v)
	}
	if v := r.TopK; v != nil {
		if *v < -1 {
			return p, paramError("top_k", fmt.Sprintf("top_k is %d: want 0 or -1 (off) or a positive count", *v))
		}
		p.sampling.TopK = max(*v, 0)
	}
	if r.Seed != nil {
		p.seeded = true
		p.sampling.Seed = uint64(*r.Seed)
	}
	if v := r.N; v != nil {
		if *v < 1 || *v > maxChoices {
			return p, paramError("n", fmt.Sprintf("n is %d: want 1 to %d", *v, maxChoices))
		}
		p.n = *v
	}
	if len(r.Stop) > maxStops {
		return p, paramError("stop", fmt.Sprintf("%d stop strings: at most %d", len(r.Stop), maxStops))
	}
	for _, s := range r.Stop {
		if s != "" {
			p.stops = append(p.stops, s)
		}
	}
	if isSet(r.Logprobs) {
		return p, paramError("logprobs", "logprobs are not supported")
	}
	if isSet(r.LogitBias) {
		return p, paramError("logit_bias", "logit_bias is not supported")
	}
	return p, nil
}

// modelDefaults puts the sampling the model recommends (Backend.Sampling:
// its temperature, top_p and top_k, where they lie in the ranges a request
// may give) where r gave none, in place of OpenAI's defaults, as vLLM's
// server does.
func (r *samplingRequest) modelDefaults(p *genParams, rec tokenizer.Sampling) {
	if v := rec.Temperature; v != nil && r.Temperature == nil && *v >= 0 && *v <= 2 {
		p.sampling.Temperature = float32(*v)
	}
	if v := rec.TopP; v != nil && r.TopP == nil && *v > 0 && *v <= 1 {
		p.sampling.TopP = float32(*v)
	}
	if v := rec.TopK; v != nil && r.TopK == nil && *v >= 0 {
		p.sampling.TopK = *v
	}
}

// checkRange stores *v in dst when it is given and within [lo, hi].
func checkRange(v *float64, name string, lo, hi float64, dst *float32) *apiError {
	if v == nil {
		return nil
	}
	if !(*v >= lo && *v <= hi) {
		return paramError(name, fmt.Sprintf("%s is %g: want %g to %g", name, *v, lo, hi))
	}
	*dst = float32(*v)
	return nil
}

// choiceSampling is the sampler of choice i: a given seed is offset by i so
// that the choices differ, and a seed of 0 is kept reproducible.
func (p *genParams) choiceSampling(i int) sample.Params {
	s := p.sampling
	if p.seeded {
		s.Seed += uint64(i)
		if s.Seed == 0 {
			s.Seed = zeroSeed
		}
	}
	return s
}
