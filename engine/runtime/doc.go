// Package runtime serves many generation requests at once on one model: a
// continuous-batching scheduler running in its own goroutine, a paged KV
// cache it owns, and a stream of events per request.
//
// # Requests and streams
//
// Generate validates a Request (a prompt that can never fit is refused at
// once with ErrPromptTooLong) and returns a *Stream. The consumer calls
// Stream.Next until it returns false; the events are text deltas (with the
// token ids behind them), then exactly one final event: Done (finish reason
// stop, length or cancelled; for length, Event.Limit says which limit:
// MaxTokens, the model's context, or the KV cache when the budget holds
// fewer tokens than the context, as Runtime.SeqLimit reports) or Error.
// Each Request gets its own sampler,
// so seeded sampling gives the same tokens however the request was batched
// or preempted.
//
// Delivery never blocks the scheduler. A stream is a small mailbox: deltas
// that the consumer has not picked up yet are merged into one (text and
// token ids appended), and the final event sits in its own slot, so a slow
// consumer loses nothing: it sees fewer, larger deltas, and always the final
// event. What a mailbox holds is bounded by the request's own output.
// Text is valid UTF-8 only: the runtime holds back an incomplete trailing
// character until the next token completes it.
//
// # One step
//
// The scheduler loop repeats: take new requests, drop cancelled ones (their
// blocks go back to the pool at once), build a batch, run one forward pass
// (after the MTP passes when sequences speculate), sample. A batch is filled up to Options.MaxBatchTokens tokens:
//
//  1. one decode token for every running sequence that has one pending,
//     oldest first (after a hybrid model's speculative rollback, the tokens
//     to recompute with it);
//  2. drafts for the decoding sequences that speculate (see below);
//  3. a chunk of the remaining prompt of running sequences still in
//     prefill (chunked prefill: a long prompt spans several steps);
//  4. chunks of waiting requests, admitted in arrival order while fewer than
//     Options.MaxSeqs run and the cache (and, for a hybrid model, the state
//     pool) has room (leaving a block of headroom per running sequence). Admission stops at the first request
//     that does not fit, so a long prompt is not starved by short ones. A
//     request admitted starts from the longest cached prefix of its tokens
//     (see Conversation reuse).
//
// Cached prefixes make room first: when a chunk, a decode token or a draft
// needs blocks (or a state slot) that are not free, the least recently used
// cached prefixes are evicted. Only then, when a decode token still cannot
// get a cache slot, the newest running sequence
// is preempted: its blocks are freed and it returns to the waiting queue
// holding its prompt plus the tokens generated so far, which are recomputed
// when it is admitted again. Its output is unchanged: tokens already
// emitted are never sampled again. The oldest sequence is never preempted
// for a newer one, and no sequence may grow past the whole cache (such a
// sequence finishes with reason length), so every request finishes.
//
// Sampling reads as little of the logits as it can: a sequence whose
// sampler draws exactly the same from a row's best entries (greedy
// decoding, top-k without penalties: sample.Sampler.Candidates) asks for
// those (model.Batch.Top: 1 when every such sequence is greedy, else 256),
// which a device model reduces on its device (kernels.SampleOps), so a
// step sends back a few values per row rather than the vocabulary; the
// others get whole rows (model.Seq.Full), sampled on several goroutines
// before the step's tokens are emitted in order; and a row whose entries
// cannot decide (sample.Sampler.SampleTop) is read whole from the device
// (model.Output.Logits). Stats.TopRows and TopMisses count them. Tokens
// are the same whichever way a row is sampled.
//
// A panic anywhere in a step (model, sampler, detokenizer, scheduler) is
// recovered: the requests in that step get an Error event and their blocks
// are freed; the runtime keeps serving the others. The event's Err is a
// *PanicError holding the panicking goroutine's stack, which a log/slog
// record of it carries. A Forward error is handled the same way.
//
// # Recurrent state
//
// When the model is a model.StateModel (linear-attention layers), the
// runtime owns a linattn.StatePool (model.NewStatePool: rows of tensors
// in the model's device memory) of Options.StateBudget bytes (default:
// MaxSeqs slots, plus the snapshots speculation needs when the model has an
// MTP module: one per draft token of a verifying sequence). A sequence gets a zeroed slot when admitted and gives it
// back whenever its cache handle goes (finish, cancel, error, preemption):
// a preempted sequence recomputes its state from position 0 with its K/V.
// Admission stops while the pool has no free slot, so a budget below
// MaxSeqs slots lowers concurrency; New refuses one below a single slot
// (ErrStateBudget). The state checkpoints of cached prefixes (see below)
// take the pool's spare room and give it back when a sequence or a
// snapshot needs it. Stats.RecurrentBytes is the pool's bytes in use.
//
// # Speculative decoding (MTP)
//
// With a model.MTPModel and a draft length k > 0 (Options.Draft, or
// Request.Draft per request), each sequence drafts with the model's MTP
// module inside the continuous batch. The MTP's cache row at position j
// combines the target's post-norm hidden state at j with the token at j+1,
// so every forward pass of a speculating sequence asks for its hidden
// states (Seq.Hidden), and the step after feeds the MTP module those it
// has not seen ("draft extend": prompt chunks, accepted tokens). A step of
// a decoding sequence whose last token is t at position p then runs:
//
//  1. MTP pass 0: the pending extension rows, the last being the target's
//     hidden state at p-1 with t: its logits give draft d1 (drawn with the
//     request's own sampler: argmax for greedy, else from its distribution
//     q, which is kept). Passes 1..k-1 chain one row each: the MTP's own
//     post-norm output hidden state with d_i gives d_{i+1}. All sequences
//     drafting in the step share each pass.
//  2. The target's forward pass, where the sequence's entry is [t, d1..dk]
//     with every row's logits (model.AllLogits) and hidden states.
//  3. Verification in order: greedy accepts a draft equal to the target's
//     choice; sampling accepts d with probability min(1, p(d)/q(d)) and on
//     rejection draws from norm(max(0, p−q)); if all pass, a bonus token is
//     drawn from the last row. So greedy output is plain greedy decoding's,
//     token for token, and sampled output is distributed exactly as plain
//     sampling's (a seeded request's tokens differ from plain decoding's,
//     and depend on the draft lengths, hence on the load). Stop ids,
//     MaxTokens and the length limit apply to each emitted token.
//  4. Rollback: the cache (target and MTP layers) is truncated to the
//     accepted positions. A hybrid model's linear layers have run over the
//     rejected drafts too: the pass itself recorded the recurrent state
//     after the last pending token and after each draft but the last
//     (model.Seq.Record, kernels.Recurrent.Record: backend copies, nothing
//     on the host), and the slot is restored from the one after the last
//     accepted position; nothing runs again. This costs one snapshot per
//     draft token of each verifying sequence (from the state pool; fewer
//     free: shorter drafts) and keeps a hybrid's verification window at 8
//     tokens or fewer, where the delta rule runs token by token exactly as
//     in plain decoding, so the recorded states are plain decoding's.
//
// The draft length adapts per sequence: each draft position keeps an
// estimate of its acceptance (given the earlier ones passed) and the
// sequence drafts while the estimated chance that all drafts so far pass is
// at least 1/4; when the first draft is hardly ever accepted (< 10 %) it
// only probes with one draft every 8 steps, and its MTP module takes the
// hidden states of the steps in between with the probe, in one pass. Drafts also stop short of
// MaxTokens, the length limit, the step's token budget and the free cache
// blocks; they never preempt. In steps with more than Options.DraftMaxSeqs
// running sequences (default 8) nothing is drafted: a large batch is
// compute-bound, and drafts would cost more than they save. The MTP cache
// is still extended then, so drafting resumes when the load drops.
//
// Drafting is also cost-aware (unless Options.DraftIgnoreCost): decode
// steps (no prompt chunk) are timed from scheduling to the last sampled
// token, MTP passes included, and an estimate of the seconds per emitted
// token is kept for steps with drafts and steps without. Steps alternate
// between the two kinds until two plain steps are measured; then one in 32
// runs plain. When the drafting steps cost more than 5 % more per token,
// nobody drafts but for a probe step now and then (after 32 steps, the gap
// doubling after each probe that finds drafting still slower, up to 256),
// and the MTP module is fed the target's hidden states 16 at a time (and
// before a probe) rather than every step; drafting resumes once its steps
// cost less than plain ones. Greedy output does not depend on any of this;
// sampled output is distributed the same either way.
//
// One device step (Options.OneStepDrafts, FERRITE_MTP_ONESTEP=1): with a
// model.SpecModel whose backend feeds drafts on the device
// (kernels.DraftOps), a step whose drafting sequences are all greedy runs
// its MTP passes and its main pass as one step of the device (one CUDA
// graph, one wait): each pass's argmax goes into the token ids of the
// passes after it on the device (the chained drafts, then the
// verification), and the drafts the host verifies are read back from the
// passes with everything else. A step that only feeds the MTP module
// (drafting off for its sequences) merges that pass the same way. Nothing
// else changes: the tokens, the rollback and the acceptance are those of
// the two-step path. Stats.Passes times each kind of pass.
//
// Usage reports per request the verification steps, drafts, accepted drafts
// (per step, and the acceptance rate of each draft position); Stats the
// same engine-wide.
//
// # Conversation reuse
//
// A chat sends its whole history every turn. The runtime keeps what
// sequences have computed as cached prefixes (Options.PrefixCache, on by
// default): a sequence's prompt once it is computed, and the whole
// sequence when it ends normally (stop, length, cancelled; not after an
// error). A prefix is its token ids, a kvcache.Seq holding the K/V of the
// first n of them, and for a hybrid model the recurrent state after them.
// When a request is admitted, the prefix with the longest common prefix
// with its tokens gives the first d of them: kvcache.Cache.Fork shares its
// blocks (a shared partial last block is copied before the first write
// into it), and only tokens[d:] are computed. d stops one short of the
// last token, whose logits are needed (a repeated prompt reuses all but
// its last token). Usage.CachedTokens reports d at the request's first
// admission (a preempted request may reuse again when it comes back;
// Stats.CachedTokens counts every admission, and Stats.PromptTokens only
// what was computed). Several requests may
// fork one prefix at once; nothing ever writes what a prefix uses (its
// positions' K/V, its valid MTP rows).
//
// With attention alone, a prefix that another one extends (the same
// conversation one turn earlier, or the prompt within its own sequence) is
// dropped when the longer one is cached, so a conversation holds one
// prefix; the blocks are shared anyway. Prefixes are evicted least
// recently used first, when there are more than Options.PrefixCache, when
// the cache or the state pool needs room (before any running sequence is
// preempted), and all at once by Runtime.DropPrefixCache (a chat's /clear;
// tests).
//
// Hybrid models. A recurrent state cannot be cut back to an earlier
// position, so a hybrid's prefix is usable only at its full length, where
// its state checkpoint was taken: after the prompt (a snapshot taken when
// the prefill ends, if the pool has room no waiting request could use:
// it serves a next turn whose history renders the reply differently) and
// at the end of the sequence (its own slot, or, when it ended while
// verifying drafts, the snapshot taken before them). The fork copies the
// checkpoint into its new slot (StatePool.Copy or Restore); when the pool
// has no room but for that very checkpoint, the new sequence takes the
// checkpoint's slot over. A prefix whose whole length does not match is
// not used; the shorter checkpoints of a conversation are the first to be
// evicted, not dropped, as they serve branches of it.
//
// MTP models. The MTP layer's cache row j combines the target's hidden
// state at j with token j+1, and lags the target by a step or so. A
// prefix records how many MTP rows are valid (m), and keeps the target's
// hidden states of the positions past them (at most 32). A speculating
// sequence forking d tokens keeps the rows below min(m, d, lcp−1) (row j
// needs token j+1 to match too), copies the blocks holding the rest
// rather than sharing them, and feeds its MTP module the kept hidden
// states, exactly as if it had computed the prefix itself; without those
// hidden states d is cut to the valid rows (a hybrid, whose d is fixed,
// then skips the prefix). A sequence that does not speculate ignores the
// MTP rows, and passes on the count of those still valid.
//
// Stats reports the prefixes held, the blocks they reference, their state
// checkpoints' bytes, and the admissions and tokens served since New.
//
// # Stats
//
// Stats returns the snapshot published after every step (an atomic
// pointer load, no lock): KV blocks and bytes in use, recurrent state in
// use, running and waiting sequences, the last batch, steps per second,
// speculative acceptance. Per-request usage and timing ride on the events.
//
// # Hooks for later
//
//   - Finer-grained reuse: a prefix is evicted whole; truncating its tail
//     blocks first (attention models) would keep more of a conversation
//     under pressure. Matching is a scan of at most Options.PrefixCache
//     prefixes per admission; a radix tree would scale to many more.
//   - Per-token recurrent states: a model that recorded the state after
//     each verified token (a DeltaRule and ShortConv that also write them) into
//     per-position snapshots would let a hybrid restore the accepted
//     position directly, with no recomputation and no 8-token window.
//
// The Runtime owns its model while it runs: nothing else may call Forward
// or ForwardMTP.
package runtime
