package runtime

import "time"

// Stats returns the snapshot published after the last step. It is cheap
// (an atomic load) and safe from any goroutine.
func (r *Runtime) Stats() Stats { return *r.stats.Load() }

// Stats is an engine-wide snapshot.
type Stats struct {
	KVBlockSize    int   // tokens per cache block
	KVBlocksUsed   int   // blocks held by sequences
	KVBlocksTotal  int   // blocks in the pool
	KVBytesUsed    int64 // KVBlocksUsed × bytes per block
	KVBytesTotal   int64 // the pool's bytes (≤ KVBudget)
	KVBudget       int64 // Options.KVBudget
	RecurrentBytes int64 // per-sequence recurrent state in use (always 0 until hybrid models hold state slots)

	Running int // sequences admitted (holding or about to hold cache blocks)
	Waiting int // requests queued or preempted, waiting for admission

	LastBatchSeqs   int           // sequences in the last step
	LastBatchTokens int           // tokens in the last step
	LastStep        time.Duration // wall time of the last step
	StepsPerSec     float64       // over the last second or so of work; 0 when idle
	Steps           uint64        // steps run since New

	PromptTokens    uint64 // prompt tokens (and tokens recomputed after preemption) run since New
	GeneratedTokens uint64 // tokens sampled since New
	Preemptions     uint64 // sequences preempted since New
	Failed          uint64 // requests ended by an Error event since New (panics, Forward errors, Close)
	MaxSeqLen       int    // see Runtime.MaxSeqLen
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
	}
	r.stats.Store(st)
}
