package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Defaults for zero Options fields.
const (
	DefaultMaxBatchTokens = 512
	DefaultMaxSeqs        = 16

	// DefaultDraftMaxSeqs is the most running sequences for which
	// speculative decoding stays on (Options.DraftMaxSeqs 0). Verifying k
	// drafts costs k extra rows per sequence in the target's forward pass:
	// nearly free while a small batch is bound by reading the weights, pure
	// waste of compute once a large batch is bound by arithmetic.
	DefaultDraftMaxSeqs = 8
)

// MaxDraft is the most draft tokens per sequence and step.
const MaxDraft = 16

var (
	// ErrClosed is returned by Generate after Close, and is the Err of the
	// final event of every request still pending when Close is called.
	ErrClosed = errors.New("runtime: closed")
	// ErrPromptTooLong is wrapped by Generate's error for a prompt longer
	// than the model's context or than the whole KV cache.
	ErrPromptTooLong = errors.New("runtime: prompt too long")
	// ErrStateBudget is wrapped by New's error when Options.StateBudget
	// cannot hold one sequence's recurrent state, and by the error of a
	// request that can never get a state slot.
	ErrStateBudget = errors.New("runtime: recurrent state budget too small")
)

// PanicError is the Err of the Error event of a request whose step
// panicked.
type PanicError struct {
	Value any    // what was passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string { return fmt.Sprintf("runtime: engine step panicked: %v", e.Value) }

// LogValue makes a PanicError logged with log/slog carry its stack.
func (e *PanicError) LogValue() slog.Value {
	return slog.GroupValue(slog.String("msg", e.Error()), slog.String("stack", string(e.Stack)))
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// TextDecoder turns a stream of generated ids into text, one id at a time;
// *tokenizer.StreamDecoder is one. If it also has a Flush() string method,
// Flush is called when generation ends to get the text still held back.
// A decoder is used by the scheduler goroutine only.
type TextDecoder interface {
	Add(id int32) string
}

// flusher is the optional end-of-stream half of a TextDecoder.
type flusher interface {
	Flush() string
}

// Options configure a Runtime.
type Options struct {
	KVBudget       int64 // bytes of K/V cache storage (required)
	BlockSize      int   // cache tokens per block; 0 means kvcache.DefaultBlockSize
	MaxBatchTokens int   // token budget of one step (decode tokens + prompt chunks); 0 means BatchTokens(m)
	MaxSeqs        int   // most sequences running at once; 0 means DefaultMaxSeqs; capped at MaxBatchTokens

	// StateBudget is the bytes of recurrent state (models with
	// linear-attention layers, model.StateModel): one slot per running
	// sequence plus, for speculative decoding, one snapshot per draft
	// token of each sequence verifying drafts (the states a rejection
	// rolls back to). 0 means room for MaxSeqs slots and, when the model
	// has an MTP module, min(Draft, 7) snapshots for each of
	// min(MaxSeqs, draft sequences) (fewer leave shorter drafts). A budget
	// below one slot is refused (ErrStateBudget); a smaller budget than
	// the default lowers the number of sequences that run at once. Room
	// that these leave free holds the state checkpoints of cached
	// prefixes (PrefixCache): a larger budget keeps more conversations.
	StateBudget int64

	// Draft is the number of tokens the model's MTP module drafts for
	// each sequence per step (speculative decoding; model.MTPModel only:
	// New refuses Draft > 0 for other models). 0 turns it off; values
	// above MaxDraft are capped. Request.Draft overrides it per request.
	// The draft length adapts to each sequence's measured acceptance
	// (never below 1) and is capped so that hybrid models verify at most 8
	// tokens at once (see doc.go).
	Draft int
	// DraftMaxSeqs turns speculation off in steps where more sequences
	// than this are running; 0 means DefaultDraftMaxSeqs, negative means
	// no limit.
	DraftMaxSeqs int
	// DraftIgnoreCost keeps drafting however much it costs. By default the
	// runtime times its decode steps, with and without drafts, and while
	// the steps with drafts emit tokens more slowly (by more than 5 %) it
	// drafts for nobody but an occasional probe step (see doc.go and
	// Stats.DraftSuppressed):
	// on a compute-bound backend verifying k+1 tokens costs nearly k+1
	// plain steps, and speculation loses whatever the acceptance.
	DraftIgnoreCost bool
	// OneStepDrafts runs a step's MTP draft passes and its verification as
	// one step of the model's device when every drafting sequence is
	// greedy and the model can (model.SpecModel): each draft reaches the
	// passes after it on the device, without a round trip to the host in
	// between. 0 means the FERRITE_MTP_ONESTEP environment variable's
	// choice (1 on, else off), positive on, negative off.
	OneStepDrafts int

	// PrefixCache is the most cached prefixes kept for conversation reuse
	// (see doc.go): 0 means DefaultPrefixCache, negative turns reuse off.
	// Cached prefixes live in the KV cache and the state pool beside the
	// running sequences and are evicted, least recently used first, when
	// those need the room.
	PrefixCache int

	// PadBatch pads every forward pass whose entries are all one token
	// (decode steps, MTP draft passes) with inert entries up to a batch
	// bucket (1, 2, 4, 8, 16, 32, 48, 64, then multiples of 32), so that a
	// device that replays repeated steps as graphs (kernels.StepGrapher:
	// CUDA) replays them across batch sizes (see pad.go): 0 means on for
	// such a device, positive on, negative off. Models with recurrent
	// state are never padded.
	PadBatch int

	// NewDecoder makes each request's detokenizer; nil means events carry
	// token ids only.
	NewDecoder func() TextDecoder

	// DeviceErr, when set, is asked after every forward pass whether the
	// backend failed during it (a GPU whose kernels cannot return errors
	// through kernels.Backend): a non-nil error fails the step's requests
	// with it, as a Forward error does, and the runtime keeps serving.
	DeviceErr func() error

	// DeviceMemory, when set, is asked after every step what the model
	// holds in its backend's memory (engine.Loaded.Memory); Stats.Memory
	// carries the answer. It must be cheap and safe from the runtime's
	// goroutine.
	DeviceMemory func() kernels.MemoryUse
}

// Runtime is a running scheduler bound to one model and its KV cache.
type Runtime struct {
	m      model.Model
	info   model.Info
	opts   Options
	cache  *kvcache.Cache     // owned by the loop goroutine
	states *linattn.StatePool // recurrent-state slots; nil unless m is a model.StateModel with linear layers
	mtp    model.MTPModel     // m's MTP module; nil without one
	spec   model.SpecModel    // m as a SpecModel when OneStepDrafts is on and it can; else nil
	limit  int                // most tokens one sequence may hold in the cache: min(MaxContext, whole cache)

	mu       sync.Mutex      // guards incoming, drops, closed and nextID
	incoming []*seq          // accepted by Generate, not yet seen by the loop
	drops    []chan struct{} // DropPrefixCache calls waiting for the loop
	closed   bool
	nextID   uint64

	wake      chan struct{} // (cap 1) poked on new requests and cancellations
	quit      chan struct{} // closed by Close
	loopDone  chan struct{} // closed when the loop has exited
	closeOnce sync.Once

	stats atomic.Pointer[Stats] // the last published snapshot

	sched scheduler // state owned by the loop goroutine
}

// BatchTokens is the step token budget for m when Options.MaxBatchTokens
// is 0: the preferred budget of the device m runs on (kernels.BatchSizer:
// a GPU's, for long prompt chunks), else DefaultMaxBatchTokens.
func BatchTokens(m model.Model) int {
	if dm := model.AsDevice(m); dm != nil {
		if bs, ok := dm.Device().(kernels.BatchSizer); ok && bs.PreferredBatchTokens() > 0 {
			return bs.PreferredBatchTokens()
		}
	}
	return DefaultMaxBatchTokens
}

// kvNeed is the KV budget New gives the cache: opts.KVBudget, or less
// where the model's context bounds what can ever be held. Each running
// sequence and each cached prefix holds at most the blocks of the context
// and a speculative overhang (MaxDraft tokens), and one more, so a budget
// above that would only be reserved, never used: the built-in model
// (1,024 tokens at 1.5 KiB) reserved 1 GiB by default where 124 MiB hold
// everything it can keep.
func kvNeed(m model.Model, opts Options) int64 {
	ctx := m.Info().MaxContext
	per := m.CacheLayout().BytesPerToken()
	if ctx <= 0 || per <= 0 {
		return opts.KVBudget
	}
	bs := opts.BlockSize
	if bs <= 0 {
		bs = kvcache.DefaultBlockSize
	}
	seqs := int64(opts.MaxSeqs + max(opts.PrefixCache, 0))
	need := seqs * int64((ctx+MaxDraft+bs-1)/bs+1) * int64(bs) * per
	return min(opts.KVBudget, need)
}

// New starts a runtime serving m. The runtime owns m until Close: nothing
// else may call m.Forward.
func New(m model.Model, opts Options) (*Runtime, error) {
	if opts.KVBudget <= 0 {
		return nil, errors.New("runtime: Options.KVBudget must be positive")
	}
	if opts.MaxBatchTokens < 0 || opts.MaxSeqs < 0 || opts.StateBudget < 0 || opts.Draft < 0 {
		return nil, fmt.Errorf("runtime: negative MaxBatchTokens (%d), MaxSeqs (%d), StateBudget (%d) or Draft (%d)",
			opts.MaxBatchTokens, opts.MaxSeqs, opts.StateBudget, opts.Draft)
	}
	if opts.MaxBatchTokens == 0 {
		opts.MaxBatchTokens = BatchTokens(m)
	}
	if opts.MaxSeqs == 0 {
		opts.MaxSeqs = DefaultMaxSeqs
	}
	// Every running sequence's decode token must fit in one step.
	opts.MaxSeqs = min(opts.MaxSeqs, opts.MaxBatchTokens)
	if opts.DraftMaxSeqs == 0 {
		opts.DraftMaxSeqs = DefaultDraftMaxSeqs
	}
	if opts.PrefixCache == 0 {
		opts.PrefixCache = DefaultPrefixCache
	}
	opts.Draft = min(opts.Draft, MaxDraft)
	mtp, _ := m.(model.MTPModel)
	if opts.Draft > 0 && mtp == nil {
		return nil, fmt.Errorf("runtime: Options.Draft %d needs a model with an MTP module (model.MTPModel); %s has none", opts.Draft, m.Info().Arch)
	}
	states, err := newStatePool(m, mtp != nil, &opts)
	if err != nil {
		return nil, err
	}
	padOn(m, &opts, states != nil)
	cache, err := model.NewCache(m, kvcache.Options{BlockSize: opts.BlockSize, Budget: kvNeed(m, opts)})
	if err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	info := m.Info()
	cs := cache.Stats()
	limit := cs.BlocksTotal * cs.BlockSize
	if info.MaxContext > 0 {
		limit = min(limit, info.MaxContext)
	}
	// Step inputs sized by the limits, not by the steps timing happens to form.
	if err := model.ReserveSteps(m, opts.MaxBatchTokens, opts.MaxSeqs, (limit+cs.BlockSize-1)/cs.BlockSize); err != nil {
		cache.Release()
		if states != nil {
			states.Release()
		}
		return nil, fmt.Errorf("runtime: %w", err)
	}
	r := &Runtime{
		m:        m,
		info:     info,
		opts:     opts,
		cache:    cache,
		states:   states,
		mtp:      mtp,
		limit:    limit,
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	if sm, ok := m.(model.SpecModel); ok && oneStep(opts.OneStepDrafts) && sm.SpecReady() {
		r.spec = sm
	}
	r.sched.init(r)
	r.publish()
	go r.loop()
	return r, nil
}

// oneStep resolves Options.OneStepDrafts.
func oneStep(o int) bool {
	if o == 0 {
		return os.Getenv("FERRITE_MTP_ONESTEP") == "1"
	}
	return o > 0
}

// newStatePool makes the recurrent-state pool of a model.StateModel (nil
// for other models) and settles opts.StateBudget.
func newStatePool(m model.Model, hasMTP bool, opts *Options) (*linattn.StatePool, error) {
	sm, ok := m.(model.StateModel)
	if !ok {
		return nil, nil
	}
	layout := sm.StateLayout()
	if len(layout) == 0 {
		return nil, nil
	}
	var per int64
	for _, l := range layout {
		per += l.Bytes()
	}
	if opts.StateBudget == 0 {
		slots := int64(opts.MaxSeqs)
		if hasMTP {
			verifying := opts.MaxSeqs // snapshots for verification...
			if opts.DraftMaxSeqs > 0 {
				verifying = min(verifying, opts.DraftMaxSeqs) // ...of at most DraftMaxSeqs sequences
			}
			slots += int64(verifying * min(max(opts.Draft, 1), maxStateVerify-1)) // one per draft token
		}
		opts.StateBudget = slots * per
	}
	if opts.StateBudget < per {
		return nil, fmt.Errorf("%w: StateBudget %d bytes, one sequence of %s takes %d", ErrStateBudget, opts.StateBudget, m.Info().Arch, per)
	}
	p, err := model.NewStatePool(sm, opts.StateBudget)
	if err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	return p, nil
}

// Close stops the scheduler: every pending request ends with an Error event
// wrapping ErrClosed, the loop goroutine exits (releasing the KV cache and
// the state pool in the model's backend memory), and later Generate calls
// fail. Close waits for a step in progress to finish. It is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		close(r.quit)
	})
	<-r.loopDone
	return nil
}

// DropPrefixCache empties the prefix cache (conversation reuse), returning
// its blocks and state checkpoints to their pools, and waits until it is
// done. Running requests keep what they have already reused.
func (r *Runtime) DropPrefixCache() {
	done := make(chan struct{})
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.drops = append(r.drops, done)
	r.mu.Unlock()
	r.poke()
	select {
	case <-done:
	case <-r.loopDone:
	}
}

// MaxSeqLen is the most tokens (prompt plus generated) one request may
// hold: the model's context or the whole cache, whichever is smaller.
func (r *Runtime) MaxSeqLen() int { return r.limit }

// SeqLimit says what sets MaxSeqLen: LimitContext (the model's context) or
// LimitKVCache (the whole cache, when the KV budget holds fewer tokens).
func (r *Runtime) SeqLimit() LengthLimit {
	if r.info.MaxContext > 0 && r.limit == r.info.MaxContext {
		return LimitContext
	}
	return LimitKVCache
}

// Generate queues req and returns its event stream. It fails at once, with
// no stream, for an empty prompt, an id outside the vocabulary, or a prompt
// that can never fit (ErrPromptTooLong). Cancelling ctx ends the request
// (final event Done with FinishCancelled) and frees its cache blocks at the
// next step boundary.
func (r *Runtime) Generate(ctx context.Context, req Request) (*Stream, error) {
	st, err := r.GenerateAll(ctx, []Request{req})
	if err != nil {
		return nil, err
	}
	return st[0], nil
}

// GenerateAll queues every request of reqs at once, so that the scheduler
// admits them at the same step boundary (a request's n choices: their
// steps, and so a seeded sampler's tokens, do not depend on when each was
// queued), and returns their streams in order. It fails, queuing none, as
// Generate fails for any of them.
func (r *Runtime) GenerateAll(ctx context.Context, reqs []Request) ([]*Stream, error) {
	seqs := make([]*seq, len(reqs))
	for i, req := range reqs {
		if err := r.validate(&req); err != nil {
			return nil, err
		}
		req.Stop = slices.Clone(req.Stop) // the caller may reuse its slices
		s := &seq{
			req:     req,
			tokens:  append(make([]int32, 0, len(req.Prompt)+min(max(req.MaxTokens, 16), 4096)), req.Prompt...),
			nPrompt: len(req.Prompt),
			sampler: sample.New(req.Sampling),
			arrived: time.Now(),
		}
		if r.opts.NewDecoder != nil {
			s.dec = r.opts.NewDecoder()
		}
		if k := r.draftLen(req.Draft); k > 0 {
			s.sp = newSpecSeq(k)
		}
		seqs[i] = s
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	streams := make([]*Stream, len(seqs))
	for i, s := range seqs {
		sctx, cancel := context.WithCancel(ctx)
		r.nextID++
		s.id = r.nextID
		s.stream = newStream(s.id, cancel)
		if sctx.Err() != nil {
			s.cancelled.Store(true) // cancelled already: run nothing
		}
		s.stopWatch = context.AfterFunc(sctx, func() {
			s.cancelled.Store(true)
			r.poke()
		})
		s.cancelCtx = cancel
		streams[i] = s.stream
	}
	r.incoming = append(r.incoming, seqs...)
	r.mu.Unlock()
	r.poke()
	return streams, nil
}

// validate checks what can be checked before queueing.
func (r *Runtime) validate(req *Request) error {
	n := len(req.Prompt)
	switch {
	case n == 0:
		return errors.New("runtime: empty prompt")
	case req.MaxTokens < 0:
		return fmt.Errorf("runtime: MaxTokens %d is negative", req.MaxTokens)
	case r.info.MaxContext > 0 && n > r.info.MaxContext:
		return fmt.Errorf("%w: %d tokens, the model's context is %d", ErrPromptTooLong, n, r.info.MaxContext)
	case n > r.limit:
		return fmt.Errorf("%w: %d tokens, the KV cache holds %d (budget %d bytes)", ErrPromptTooLong, n, r.limit, r.opts.KVBudget)
	}
	for i, t := range req.Prompt {
		if t < 0 || int(t) >= r.info.Vocab {
			return fmt.Errorf("runtime: prompt token %d is %d, outside the vocabulary [0, %d)", i, t, r.info.Vocab)
		}
	}
	return nil
}

// draftLen is the draft length of a request whose Request.Draft is d.
func (r *Runtime) draftLen(d int) int {
	switch {
	case r.mtp == nil || d < 0:
		return 0
	case d == 0:
		return r.opts.Draft
	}
	return min(d, MaxDraft)
}

// poke wakes the loop if it is idle.
func (r *Runtime) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
