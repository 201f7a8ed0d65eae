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
// stop, length or cancelled) or Error. Each Request gets its own sampler,
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
// blocks go back to the pool at once), build a batch, run one forward pass,
// sample. A batch is filled up to Options.MaxBatchTokens tokens:
//
//  1. one decode token for every running sequence that has one pending,
//     oldest first;
//  2. a chunk of the remaining prompt of running sequences still in
//     prefill (chunked prefill: a long prompt spans several steps);
//  3. chunks of waiting requests, admitted in arrival order while fewer than
//     Options.MaxSeqs run and the cache has room (leaving a block of
//     headroom per running sequence). Admission stops at the first request
//     that does not fit, so a long prompt is not starved by short ones.
//
// When a decode token cannot get a cache slot, the newest running sequence
// is preempted: its blocks are freed and it returns to the waiting queue
// holding its prompt plus the tokens generated so far, which are recomputed
// when it is admitted again. Its output is unchanged: tokens already
// emitted are never sampled again. The oldest sequence is never preempted
// for a newer one, and no sequence may grow past the whole cache (such a
// sequence finishes with reason length), so every request finishes.
//
// A panic anywhere in a step (model, sampler, detokenizer, scheduler) is
// recovered: the requests in that step get an Error event and their blocks
// are freed; the runtime keeps serving the others. A Forward error is
// handled the same way.
//
// # Stats
//
// Stats returns the snapshot published after every step (an atomic
// pointer load, no lock): KV blocks and bytes in use, running and waiting
// sequences, the last batch, steps per second. Per-request usage and timing
// ride on the events.
//
// # Hooks for later
//
//   - Speculative decoding (MTP): a sequence's pending work is always
//     tokens[computed:]; a drafting step would append k draft tokens, run
//     them with model.AllLogits (and Seq.Hidden for the drafter), accept a
//     prefix in advance and roll the rest back with kvcache.Cache.Truncate.
//   - Conversation-cache reuse: attach is where a new sequence gets its
//     cache handle (a kvcache.Cache.Fork of a cached conversation would set
//     computed > 0 there; Usage.CachedTokens reports it) and release is where
//     a finished one gives it back (a cache would keep it instead).
//   - Recurrent state (linear-attention layers): Stats.RecurrentBytes is
//     reported as 0 until hybrid models hold per-sequence state slots.
//
// The Runtime owns its model while it runs: nothing else may call Forward.
package runtime
