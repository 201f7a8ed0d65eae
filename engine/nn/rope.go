package nn

import (
	"fmt"
	"math"
)

// RopeConfig selects a rotary embedding. Field names follow Hugging Face's
// rope_parameters; zero values mean "absent".
type RopeConfig struct {
	HeadDim             int     // per-head dimension the rotation lives in
	PartialRotaryFactor float64 // rotate the first HeadDim·factor dims; 0 means 1
	Interleaved         bool    // rotate pairs (2i, 2i+1) (GPT-J) instead of (i, i+d/2) (NeoX)

	Theta float64 // rope_theta
	Type  string  // "default" (or ""), "linear", "llama3", "yarn"

	Factor               float64 // scaling factor (linear, llama3, yarn)
	OriginalMaxPositions int     // original_max_position_embeddings (llama3, yarn)
	MaxPositions         int     // the model's max_position_embeddings (yarn fallback)
	LowFreqFactor        float64 // llama3
	HighFreqFactor       float64 // llama3
	BetaFast, BetaSlow   float64 // yarn; 0 means 32 and 1
	Mscale, MscaleAllDim float64 // yarn
	AttentionFactor      float64 // yarn: explicit cos/sin scale; 0 means derive
	NoTruncate           bool    // yarn: truncate=false (keep fractional correction bounds)
	// FreqFactors, when set (one per rotated pair), divide the inverse
	// frequencies after the type's scaling: llama.cpp's rope_freqs.
	FreqFactors []float64
}

// RoPE is a rotary position embedding as a model loads it: the inverse
// frequencies with every scaling applied, which kernels.Rotary carries to
// the op set (ref.RoPE is the rotation).
type RoPE struct {
	Dim         int     // rotated dims per head (even), the first Dim of each vector
	Interleaved bool    // pair (2i, 2i+1) rather than (i, i+Dim/2)
	Scale       float32 // multiplies cos and sin (YaRN attention factor; 1 otherwise)

	invFreq []float32 // (Dim/2) inverse frequencies
}

// NewRoPE builds the inverse frequencies for c.
func NewRoPE(c RopeConfig) (*RoPE, error) {
	f := c.PartialRotaryFactor
	if f == 0 {
		f = 1
	}
	dim := int(float64(c.HeadDim) * f)
	if dim <= 0 || dim%2 != 0 || dim > c.HeadDim {
		return nil, fmt.Errorf("rope: rotary dim %d (head_dim %d × partial_rotary_factor %g) must be even and in (0, head_dim]", dim, c.HeadDim, f)
	}
	if c.Theta <= 0 {
		return nil, fmt.Errorf("rope: rope_theta %g must be positive", c.Theta)
	}
	r := &RoPE{Dim: dim, Interleaved: c.Interleaved, Scale: 1}
	half := dim / 2
	// Default frequencies, computed as the reference does in fp32:
	// inv_freq = 1 / θ^(2i/dim).
	inv := make([]float64, half)
	for i := range inv {
		e := float32(2*i) / float32(dim)
		p := float32(math.Pow(c.Theta, float64(e)))
		inv[i] = float64(float32(1 / float64(p)))
	}
	switch c.Type {
	case "", "default":
	case "linear":
		if c.Factor <= 0 {
			return nil, fmt.Errorf("rope: linear scaling needs a positive factor, got %g", c.Factor)
		}
		for i := range inv {
			inv[i] /= c.Factor
		}
	case "llama3":
		if err := llama3Freqs(inv, c); err != nil {
			return nil, err
		}
	case "yarn":
		s, err := yarnFreqs(inv, c, dim)
		if err != nil {
			return nil, err
		}
		r.Scale = s
	default:
		return nil, fmt.Errorf("rope: unsupported rope type %q (supported: default, linear, llama3, yarn)", c.Type)
	}
	if c.FreqFactors != nil {
		if len(c.FreqFactors) != half {
			return nil, fmt.Errorf("rope: %d freq_factors for %d rotated pairs", len(c.FreqFactors), half)
		}
		for i, f := range c.FreqFactors {
			if !(f > 0) {
				return nil, fmt.Errorf("rope: freq_factors[%d] = %g must be positive", i, f)
			}
			inv[i] /= f
		}
	}
	r.invFreq = make([]float32, half)
	for i, v := range inv {
		r.invFreq[i] = float32(v)
	}
	return r, nil
}

// llama3Freqs applies Llama 3.1's frequency-dependent scaling in place.
func llama3Freqs(inv []float64, c RopeConfig) error {
	if c.Factor <= 0 || c.OriginalMaxPositions <= 0 || c.LowFreqFactor <= 0 || c.HighFreqFactor <= c.LowFreqFactor {
		return fmt.Errorf("rope: llama3 scaling needs factor, original_max_position_embeddings and low_freq_factor < high_freq_factor (got %g, %d, %g, %g)",
			c.Factor, c.OriginalMaxPositions, c.LowFreqFactor, c.HighFreqFactor)
	}
	old := float64(c.OriginalMaxPositions)
	lowWave, highWave := old/c.LowFreqFactor, old/c.HighFreqFactor
	for i, f := range inv {
		wave := 2 * math.Pi / f
		switch {
		case wave < highWave: // high frequency: unchanged
		case wave > lowWave: // low frequency: interpolated
			inv[i] = f / c.Factor
		default: // in between: smooth blend
			s := (old/wave - c.LowFreqFactor) / (c.HighFreqFactor - c.LowFreqFactor)
			inv[i] = (1-s)*f/c.Factor + s*f
		}
	}
	return nil
}

// yarnMscale is YaRN's get_mscale.
func yarnMscale(scale, m float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*m*math.Log(scale) + 1
}

// YarnMscale is YaRN's attention temperature factor 0.1·m·ln(factor) + 1
// (1 when factor ≤ 1). DeepSeek-style MLA multiplies its softmax scale by
// YarnMscale(factor, mscale_all_dim)².
func YarnMscale(factor, m float64) float64 { return yarnMscale(factor, m) }

// yarnFreqs blends interpolated and extrapolated frequencies in place and
// returns the cos/sin scale (Hugging Face _compute_yarn_parameters).
func yarnFreqs(inv []float64, c RopeConfig, dim int) (float32, error) {
	factor := c.Factor
	orig := c.OriginalMaxPositions
	if orig <= 0 {
		orig = c.MaxPositions
	}
	if factor == 0 && orig > 0 && c.MaxPositions > 0 {
		// Without an explicit factor the reference uses the ratio of the two
		// context lengths (DeepSeek-V3 style configs).
		factor = float64(c.MaxPositions) / float64(orig)
	}
	if factor <= 0 || orig <= 0 {
		return 0, fmt.Errorf("rope: yarn scaling needs factor and original_max_position_embeddings (got %g, %d)", c.Factor, orig)
	}
	att := c.AttentionFactor
	if att == 0 {
		if c.Mscale != 0 && c.MscaleAllDim != 0 {
			att = yarnMscale(factor, c.Mscale) / yarnMscale(factor, c.MscaleAllDim)
		} else {
			att = yarnMscale(factor, 1)
		}
	}
	bf, bs := c.BetaFast, c.BetaSlow
	if bf == 0 {
		bf = 32
	}
	if bs == 0 {
		bs = 1
	}
	corr := func(rot float64) float64 {
		return float64(dim) * math.Log(float64(orig)/(rot*2*math.Pi)) / (2 * math.Log(c.Theta))
	}
	low, high := corr(bf), corr(bs)
	if !c.NoTruncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(dim-1))
	if low == high {
		high += 0.001
	}
	for i, f := range inv {
		ramp := min(max((float64(i)-low)/(high-low), 0), 1)
		extra := 1 - ramp // weight of the extrapolated (original) frequency
		inv[i] = f/factor*(1-extra) + f*extra
	}
	return float32(att), nil
}

// InvFreq is the (Dim/2) inverse frequencies, scalings applied (read-only).
func (r *RoPE) InvFreq() []float32 { return r.invFreq }
