package config

// RopeParams are a model's rotary position embedding parameters, gathered
// from transformers 5's "rope_parameters", the older "rope_scaling" and the
// top level (rope_theta, partial_rotary_factor,
// original_max_position_embeddings), in that order of precedence. Fields a
// config does not set hold the documented defaults.
type RopeParams struct {
	Theta float64 // rope_theta, the base frequency; 10000 if unset
	// Type is rope_type (or the legacy "type"): "default", "linear",
	// "dynamic", "yarn", "longrope", "llama3", ...; "default" if unset. The
	// legacy "su" reads as "longrope" and Qwen2-VL's "mrope" as "default"
	// (with MRopeSection set).
	Type string

	Factor         float64 // scaling factor; 1 if unset
	OriginalMaxPos int     // original_max_position_embeddings; 0 if unset

	LowFreqFactor, HighFreqFactor float64 // llama3; 1 and 4 if unset

	BetaFast, BetaSlow   float64 // yarn; 32 and 1 if unset
	MScale, MScaleAllDim float64 // yarn (DeepSeek's mscale, mscale_all_dim); 0 if unset
	AttentionFactor      float64 // yarn / longrope attention_factor; 0 if unset (the model computes it)
	Truncate             bool    // yarn: truncate the correction range to integers; true if unset

	ShortFactor, LongFactor []float64 // longrope per-dimension factors; nil if unset

	PartialRotaryFactor float64 // fraction of head_dim rotated (partial_rotary_factor or rotary_pct); 1 if unset

	MRopeSection     []int // multimodal rope sections (Qwen-VL); nil if unset
	MRopeInterleaved bool  // mrope_interleaved (Qwen3-VL); false if unset

	// FreqFactors divide the inverse frequencies one by one after the
	// type's scaling (ferrite's "freq_factors" key, which carries a GGUF
	// file's rope_freqs tensor: llama.cpp's form of Llama 3 scaling); nil
	// if unset.
	FreqFactors []float64
}

// Rope returns the rotary embedding parameters. When rope_parameters is keyed
// by layer type (transformers 5 for models mixing full and sliding attention)
// it returns the "full_attention" entry's; see RopeFor.
func (c *Config) Rope() RopeParams { return c.rope("full_attention") }

// RopeFor returns the rotary embedding parameters of layers of the given type
// ("full_attention", "sliding_attention", ...) when rope_parameters is keyed
// by layer type, and Rope's otherwise.
func (c *Config) RopeFor(layerType string) RopeParams { return c.rope(layerType) }

// RopeHas reports whether key is set in any of the places Rope reads:
// rope_parameters, the top level or rope_scaling (for an architecture
// whose default differs from Rope's, such as partial_rotary_factor).
func (c *Config) RopeHas(key string) bool {
	return c.Has(key) || c.Sub("rope_parameters").Has(key) || c.Sub("rope_scaling").Has(key)
}

func (c *Config) rope(layerType string) RopeParams {
	params := c.Sub("rope_parameters")
	if perLayerType(params) {
		params = params.Sub(layerType)
	}
	scaling := c.Sub("rope_scaling")

	// first returns the first source that sets key.
	first := func(key string, srcs ...*Config) (*Config, bool) {
		for _, s := range srcs {
			if s.Has(key) {
				return s, true
			}
		}
		return nil, false
	}
	float := func(key string, def float64, srcs ...*Config) float64 {
		if s, ok := first(key, srcs...); ok {
			return s.FloatOr(key, def)
		}
		return def
	}
	rp := RopeParams{
		Theta:               float("rope_theta", 10000, params, c, scaling),
		Type:                "default",
		Factor:              float("factor", 1, params, scaling),
		LowFreqFactor:       float("low_freq_factor", 1, params, scaling),
		HighFreqFactor:      float("high_freq_factor", 4, params, scaling),
		BetaFast:            float("beta_fast", 32, params, scaling),
		BetaSlow:            float("beta_slow", 1, params, scaling),
		MScale:              float("mscale", 0, params, scaling),
		MScaleAllDim:        float("mscale_all_dim", 0, params, scaling),
		AttentionFactor:     float("attention_factor", 0, params, scaling),
		Truncate:            true,
		PartialRotaryFactor: float("partial_rotary_factor", 1, params, c, scaling),
	}
	if _, ok := first("partial_rotary_factor", params, c, scaling); !ok && c.Has("rotary_pct") {
		rp.PartialRotaryFactor = c.FloatOr("rotary_pct", 1)
	}
	for _, key := range []string{"rope_type", "type"} {
		if s, ok := first(key, params, scaling); ok {
			rp.Type = s.StringOr(key, "default")
			break
		}
	}
	switch rp.Type {
	case "su":
		rp.Type = "longrope"
	case "mrope":
		rp.Type = "default"
	}
	if s, ok := first("original_max_position_embeddings", params, scaling, c); ok {
		rp.OriginalMaxPos = s.IntOr("original_max_position_embeddings", 0)
	}
	if s, ok := first("truncate", params, scaling); ok {
		rp.Truncate = s.BoolOr("truncate", true)
	}
	if s, ok := first("short_factor", params, scaling); ok {
		rp.ShortFactor = s.Floats("short_factor")
	}
	if s, ok := first("long_factor", params, scaling); ok {
		rp.LongFactor = s.Floats("long_factor")
	}
	if s, ok := first("mrope_section", params, scaling); ok {
		rp.MRopeSection = s.Ints("mrope_section")
	}
	if s, ok := first("freq_factors", params, scaling); ok {
		rp.FreqFactors = s.Floats("freq_factors")
	}
	if s, ok := first("mrope_interleaved", params, scaling); ok {
		rp.MRopeInterleaved = s.BoolOr("mrope_interleaved", false)
	}
	return rp
}

// perLayerType reports whether rope_parameters is keyed by layer type
// ({"full_attention": {...}, "sliding_attention": {...}}) rather than being
// one set of parameters.
func perLayerType(p *Config) bool {
	if p.Has("rope_type") || p.Has("type") || p.Has("rope_theta") {
		return false
	}
	for _, v := range p.fields {
		if _, ok := v.(map[string]any); ok {
			return true
		}
	}
	return false
}
