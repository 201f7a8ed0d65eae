package runtime

import (
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Stats returns the snapshot published after the last step. It is cheap
// (an atomic load) and safe from any goroutine.
func (r *Runtime) Stats() Stats { return *r.stats.Load() }

// Stats is an engine-wide snapshot.
type Stats struct {
	KVBlockSize     int   // tokens per cache block
	KVBlocksUsed    int   // blocks held by sequences and cached prefixes
	KVBlocksTotal   int   // blocks in the pool
	KVBytesUsed     int64 // KVBlocksUsed × bytes per block
	KVBytesTotal    int64 // the pool's bytes (≤ KVBudget)
	KVBudget        int64 // Options.KVBudget
	RecurrentBytes  int64 // recurrent state (linear-attention layers) in use: running sequences' slots, snapshots, checkpoints
	RecurrentBudget int64 // Options.StateBudget as settled by New; 0 for models without linear layers

	Running int // sequences admitted (holding or about to hold cache blocks)
	Waiting int // requests queued or preempted, waiting for admission

	LastBatchSeqs   int           // sequences in the last step
	LastBatchTokens int           // tokens in the last step
	LastStep        time.Duration // wall time of the last step
	StepsPerSec     float64       // over the last second or so of work; 0 when idle
	Steps           uint64        // steps run since New

	PromptTokens    uint64 // prompt tokens (and tokens recomputed after preemption or a hybrid model's rollback) run since New
	GeneratedTokens uint64 // tokens sampled since New
	Preemptions     uint64 // sequences preempted since New
	Failed          uint64 // requests ended by an Error event since New (panics, Forward errors, Close)
	MaxSeqLen       int    // see Runtime.MaxSeqLen

	// Sampling from the best entries of logit rows, reduced on the model's
	// device (model.Batch.Top), since New: rows sampled that way, and rows
	// whose entries could not decide and were read whole.
	TopRows   uint64
	TopMisses uint64

	// Conversation reuse (Options.PrefixCache).
	PrefixEntries    int    // cached prefixes held
	PrefixBlocks     int    // distinct KV blocks they reference (in KVBlocksUsed; some may be shared with running sequences)
	PrefixStateBytes int64  // state checkpoints they hold (in RecurrentBytes)
	PrefixHits       uint64 // admissions that reused a cached prefix, since New
	CachedTokens     uint64 // tokens those admissions took from the cache instead of computing them

	// Speculative decoding since New (all zero without it).
	LastDraftTokens int       // draft tokens verified in the last step
	VerifySteps     uint64    // sequence-steps that verified drafts
	DraftTokens     uint64    // draft tokens verified
	AcceptedTokens  uint64    // draft tokens accepted
	AcceptRate      float64   // AcceptedTokens / DraftTokens
	AcceptedPerStep float64   // AcceptedTokens / VerifySteps (each also emits one target token)
	AcceptRateByPos []float64 // [i]: share of the drafts at position i (0 first) that were accepted

	// Where a decode step's time goes, since New (wall time on the
	// runtime's goroutine, each from the call to its outputs on the host):
	// the main model's passes of steps that only decode (one token per
	// sequence, no drafts), those of steps that verify drafts, and the MTP
	// passes (ForwardMTP calls) of steps that draft; and the steps that ran
	// their drafts and verification as one device step
	// (Options.OneStepDrafts).
	Passes PassTimes

	// Cost-aware drafting (Options.DraftIgnoreCost false): the estimated
	// wall time per emitted token of decode steps with and without drafts
	// (0 until measured; MTP passes included), and whether drafting is
	// suppressed because the former is the larger.
	DraftSecPerToken float64
	PlainSecPerToken float64
	DraftSuppressed  bool

	// Memory is what the model holds in its backend's memory
	// (Options.DeviceMemory; zero without it). The KV cache (KVBytesTotal)
	// and recurrent state are part of its Tensors on a device backend.
	Memory kernels.MemoryUse
}

// PassTimes are counts and total wall times of forward passes by kind.
type PassTimes struct {
	Decode, Verify, MTP, OneStep     uint64        // passes
	DecodeT, VerifyT, MTPT, OneStepT time.Duration // their total time
}

// Mean returns the mean time of a decode pass, a verification pass and an
// MTP pass (0 where none ran).
func (p PassTimes) Mean() (decode, verify, mtp time.Duration) {
	mean := func(t time.Duration, n uint64) time.Duration {
		if n == 0 {
			return 0
		}
		return t / time.Duration(n)
	}
	return mean(p.DecodeT, p.Decode), mean(p.VerifyT, p.Verify), mean(p.MTPT, p.MTP)
}

// Sub returns p − q (counters since a snapshot q).
func (p PassTimes) Sub(q PassTimes) PassTimes {
	return PassTimes{p.Decode - q.Decode, p.Verify - q.Verify, p.MTP - q.MTP, p.OneStep - q.OneStep,
		p.DecodeT - q.DecodeT, p.VerifyT - q.VerifyT, p.MTPT - q.MTPT, p.OneStepT - q.OneStepT}
}

// specCounts are speculative-decoding counters, per request or engine-wide.
type specCounts struct {
	steps, drafted, accepted uint64
	posDrafted               [MaxDraft]uint64 // drafts verified at each position
	posAccepted              [MaxDraft]uint64 // of which accepted
}

// add counts one verification of k drafts of which the first a were accepted.
func (c *specCounts) add(k, a int) {
	c.steps++
	c.drafted += uint64(k)
	c.accepted += uint64(a)
	for i := range k {
		c.posDrafted[i]++
		if i < a {
			c.posAccepted[i]++
		}
	}
}

// rates is the acceptance rate of each draft position ever verified.
func (c *specCounts) rates() []float64 {
	n := 0
	for n < MaxDraft && c.posDrafted[n] > 0 {
		n++
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(c.posAccepted[i]) / float64(c.posDrafted[i])
	}
	return out
}

// publish stores a fresh Stats snapshot.
func (r *Runtime) publish() {
	sc := &r.sched
	cs := r.cache.Stats()
	st := &Stats{
		KVBlockSize:     cs.BlockSize,
		KVBlocksUsed:    cs.BlocksUsed,
		KVBlocksTotal:   cs.BlocksTotal,
		KVBytesUsed:     cs.BytesUsed,
		KVBytesTotal:    cs.BytesTotal,
		KVBudget:        cs.Budget,
		Running:         len(sc.running),
		Waiting:         len(sc.waiting),
		LastBatchSeqs:   sc.lastSeqs,
		LastBatchTokens: sc.lastToks,
		LastStep:        sc.lastStep,
		StepsPerSec:     sc.stepsPerSec,
		Steps:           sc.steps,
		PromptTokens:    sc.promptToks,
		GeneratedTokens: sc.genToks,
		Preemptions:     sc.preemptTotal,
		Failed:          sc.failed,
		MaxSeqLen:       r.limit,
		TopRows:         sc.topRows,
		TopMisses:       sc.topMisses,
		LastDraftTokens: sc.lastDrafts,
		VerifySteps:     sc.spec.steps,
		DraftTokens:     sc.spec.drafted,
		AcceptedTokens:  sc.spec.accepted,
		Passes:          sc.passes,

		DraftSecPerToken: sc.cost.spec,
		PlainSecPerToken: sc.cost.plain,
		DraftSuppressed:  sc.cost.off,
	}
	if r.opts.DeviceMemory != nil {
		st.Memory = r.opts.DeviceMemory()
	}
	if r.states != nil {
		st.RecurrentBytes = r.states.Used()
		st.RecurrentBudget = r.states.Budget()
		st.PrefixStateBytes = int64(sc.prefix.checkpoints()) * r.states.BytesPerSeq()
	}
	st.PrefixEntries, st.PrefixBlocks = len(sc.prefix.entries), sc.prefixBlocks()
	st.PrefixHits, st.CachedTokens = sc.prefix.hits, sc.prefix.tokens
	if sc.spec.steps > 0 {
		st.AcceptRate = float64(sc.spec.accepted) / float64(sc.spec.drafted)
		st.AcceptedPerStep = float64(sc.spec.accepted) / float64(sc.spec.steps)
		st.AcceptRateByPos = sc.spec.rates()
	}
	r.stats.Store(st)
}
