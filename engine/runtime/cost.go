package runtime

import "time"

// Cost-aware drafting (Options.DraftIgnoreCost false). Speculation pays
// only where verifying k+1 tokens costs little more than computing one: on
// a compute-bound backend it is slower than plain decoding whatever the
// acceptance. The scheduler therefore times its decode steps and keeps, for
// steps that drafted and steps that did not, an estimate of the wall time
// per emitted token; while the drafting steps are the slower ones, nobody
// drafts, but for a probe now and then.
const (
	costEMA       = 0.2  // weight of the newest step in a cost estimate
	probeEMA      = 0.5  // ...of a probe in the drafting estimate (probes are rare)...
	offPlainEMA   = 0.05 // ...and of a plain step while drafting is off (every step is one)
	costMargin    = 0.05 // drafting goes off when its steps cost this much more per token than plain ones (and on again below parity)
	costWarmup    = 2    // steps of each kind measured before drafting can go off
	warmPlainGap  = 1    // measured steps between plain samples while the plain estimate is warming up (alternate)
	plainGap      = 32   // ...and afterwards, while drafting is on (keeps the estimate fresh)
	draftProbeGap = 32   // measured steps between drafting probes while drafting is off, at first...
	maxProbeGap   = 256  // ...doubling after each probe that leaves it off, up to this

	// While drafting is off, a sequence's hidden states wait for the MTP
	// module until this many have gathered (below maxHidRows, so that a
	// cached prefix keeps them all), or the step before a probe.
	maxMTPBacklog = maxHidRows / 2
)

// draftCost is the engine-wide cost estimate of drafting.
type draftCost struct {
	spec, plain   float64 // seconds per emitted token of decode steps with and without drafts (EWMA)
	nSpec, nPlain int     // steps measured of each kind
	off           bool    // drafting is suppressed (but for probes)
	gap           int     // measured steps since the last sample of the other kind was asked for
	probeGap      int     // measured steps between probes while off (0: draftProbeGap)
	sample        bool    // the next steps run the other kind (plain while on, drafting while off) until one is measured
}

// allow reports whether the step being built may draft.
func (c *draftCost) allow() bool { return c.off == c.sample }

// deferMTP reports whether the MTP passes that only feed the module the
// target's hidden states may wait: drafting is off, and the next step is
// not a probe (whose cost should not include the backlog).
func (c *draftCost) deferMTP() bool { return c.off && !c.sample && c.gap < c.probeEvery()-1 }

// probeEvery is the current gap between probes while drafting is off.
func (c *draftCost) probeEvery() int { return max(c.probeGap, draftProbeGap) }

// observe records a decode step (no prompt chunk, no prompt rows fed to
// the MTP module) of wall time d that
// emitted toks tokens; drafted says whether it verified drafts.
func (c *draftCost) observe(drafted bool, d time.Duration, toks int) {
	if toks <= 0 || d <= 0 {
		return
	}
	x := d.Seconds() / float64(toks)
	est, n := &c.plain, &c.nPlain
	if drafted {
		est, n = &c.spec, &c.nSpec
	}
	switch {
	case *n == 0:
		*est = x
	case drafted && c.off:
		*est += probeEMA * (x - *est)
	case c.off:
		*est += offPlainEMA * (x - *est)
	default:
		*est += costEMA * (x - *est)
	}
	*n++
	if c.sample {
		if drafted == c.off { // the kind asked for was measured
			c.sample, c.gap = false, 0
			if c.off {
				c.probeGap = min(2*c.probeEvery(), maxProbeGap) // stays off (else reset below)
			}
		}
	} else {
		c.gap++
		want := c.probeEvery()
		if !c.off {
			want = plainGap
			if c.nPlain < costWarmup {
				want = warmPlainGap
			}
		}
		c.sample = c.gap >= want
	}
	if c.nSpec >= costWarmup && c.nPlain >= costWarmup {
		switch {
		case !c.off && c.spec > c.plain*(1+costMargin):
			c.off, c.sample, c.gap = true, false, 0
		case c.off && c.spec < c.plain:
			c.off, c.sample, c.gap, c.probeGap = false, false, 0, 0
		}
	}
}
