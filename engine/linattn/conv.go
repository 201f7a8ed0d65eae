package linattn

import "fmt"

// Activation selects what Conv applies after the convolution.
type Activation uint8

const (
	ActNone Activation = iota // raw convolution output
	ActSiLU                   // silu(conv), both GDN and KDA
)

// convBlock is the channel block of one parallel work item.
const convBlock = 64

// Conv is a causal depthwise 1-D convolution over the channels of a token
// stream, as the `conv1d` of GDN/KDA layers (no padding beyond the causal
// history, one filter per channel):
//
//	y_t[ch] = act(bias[ch] + Σ_{j<K} Weight[ch, 0, j] · x_{t−K+1+j}[ch])
//
// where inputs before the sequence come from the rolling state (zeros for a
// new sequence). It holds no buffers and may be shared between goroutines.
type Conv struct {
	Channels int       // conv_dim
	K        int       // kernel width (linear_conv_kernel_dim, short_conv_kernel_size), ≥ 1
	Weight   []float32 // [Channels, 1, K] as checkpoints store it; tap K−1 multiplies the newest input
	Bias     []float32 // [Channels], or nil for none (GDN and KDA have none)
	Parallel ParallelFunc
}

// StateLen is the length of a conv state, (K−1)·Channels.
//
// A state is [K−1, Channels]: row i holds the raw (pre-convolution,
// pre-activation) input K−1−i tokens before the next one, oldest first.
func (c *Conv) StateLen() int { return (c.K - 1) * c.Channels }

func (c *Conv) check(y, x []float32, T int, state []float32) {
	switch {
	case c.Channels <= 0 || c.K <= 0:
		panic(fmt.Sprintf("linattn: bad Conv Channels %d K %d", c.Channels, c.K))
	case len(c.Weight) < c.Channels*c.K:
		panic(fmt.Sprintf("linattn: Conv weight has %d values, need %d", len(c.Weight), c.Channels*c.K))
	case c.Bias != nil && len(c.Bias) < c.Channels:
		panic(fmt.Sprintf("linattn: Conv bias has %d values, need %d", len(c.Bias), c.Channels))
	case T < 0 || len(x) < T*c.Channels || (y != nil && len(y) < T*c.Channels):
		panic(fmt.Sprintf("linattn: Conv x %d / y %d values for T=%d, Channels=%d", len(x), len(y), T, c.Channels))
	case len(state) < c.StateLen():
		panic(fmt.Sprintf("linattn: Conv state has %d values, need %d", len(state), c.StateLen()))
	}
}

// Forward convolves T tokens x [T, Channels] into y [T, Channels],
// continuing from state and leaving in it the last K−1 raw inputs. y may be
// x itself (in place) but must not otherwise overlap it.
func (c *Conv) Forward(y, x []float32, T int, state []float32, act Activation) {
	c.check(y, x, T, state)
	if T == 0 {
		return
	}
	nb := (c.Channels + convBlock - 1) / convBlock
	orSerial(c.Parallel)(nb, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			c.block(y, x, T, state, act, b*convBlock, min(c.Channels, (b+1)*convBlock))
		}
	})
}

// Step is Forward for one token (decode): x, y [Channels].
func (c *Conv) Step(y, x, state []float32, act Activation) { c.Forward(y, x, 1, state, act) }

// block runs Forward over channels [c0, c1).
func (c *Conv) block(y, x []float32, T int, state []float32, act Activation, c0, c1 int) {
	C, K, km1, nb := c.Channels, c.K, c.K-1, c1-c0
	// The new state, saved before y (possibly x) is overwritten.
	var buf [7 * convBlock]float32
	tmp := buf[:]
	if km1*nb > len(buf) {
		tmp = make([]float32, km1*nb)
	}
	for i := 0; i < km1; i++ {
		if tau := T - km1 + i; tau >= 0 {
			copy(tmp[i*nb:(i+1)*nb], x[tau*C+c0:tau*C+c1])
		} else {
			copy(tmp[i*nb:(i+1)*nb], state[(km1+tau)*C+c0:(km1+tau)*C+c1])
		}
	}
	// Outputs from the last token back, so that y may alias x: y_t only
	// reads inputs at times ≤ t, none of which has been overwritten yet.
	for t := T - 1; t >= 0; t-- {
		yr := y[t*C+c0 : t*C+c1] // [nb]
		for i := range yr {
			ch := c0 + i
			w := c.Weight[ch*K : ch*K+K] // [K]
			var acc float64
			if c.Bias != nil {
				acc = float64(c.Bias[ch])
			}
			j := 0
			for ; t-km1+j < 0; j++ { // taps reaching into the state
				acc += float64(w[j]) * float64(state[(t+j)*C+ch])
			}
			for ; j < K; j++ {
				acc += float64(w[j]) * float64(x[(t-km1+j)*C+ch])
			}
			if act == ActSiLU {
				acc *= sigmoid64(acc)
			}
			yr[i] = float32(acc)
		}
	}
	for i := 0; i < km1; i++ {
		copy(state[i*C+c0:i*C+c1], tmp[i*nb:(i+1)*nb])
	}
}

// SaveStates writes into every non-nil dst[t] ([K−1, Channels]) the conv
// state as it will be after token t of x [T, Channels], starting from
// state. Call it before Forward with the same x and state (Forward updates
// the state and may overwrite x). Speculative verification uses it to keep
// one conv state per position.
func (c *Conv) SaveStates(dst [][]float32, x []float32, T int, state []float32) {
	c.check(nil, x, T, state)
	C, km1 := c.Channels, c.K-1
	for t := 0; t < T && t < len(dst); t++ {
		d := dst[t]
		if d == nil {
			continue
		}
		if len(d) < c.StateLen() {
			panic(fmt.Sprintf("linattn: SaveStates dst[%d] has %d values, need %d", t, len(d), c.StateLen()))
		}
		for i := 0; i < km1; i++ {
			if tau := t + 1 - km1 + i; tau >= 0 {
				copy(d[i*C:(i+1)*C], x[tau*C:(tau+1)*C])
			} else {
				copy(d[i*C:(i+1)*C], state[(km1+tau)*C:(km1+tau+1)*C])
			}
		}
	}
}
