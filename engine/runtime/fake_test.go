package runtime_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
)

// fakeMTP is a tiny model with known next-token distributions and an MTP
// module whose drafts are close to them, for testing speculative decoding
// exactly and fast. The context of position p is a hash h_p of tokens
// [0, p] (fakeMix); the logits at p are fakeLogits(h_p). Cache layer 0
// stores token+1 at each position, so Forward recomputes h_p from the
// cache and any stale or missing entry changes the output. Its hidden
// state is (h_p, p).
//
// The MTP row at position p takes hidden (h, p), which it checks, and the
// token t at p+1; it predicts h' = fakeMix(h, t) and returns fakeLogits(h')
// plus noise (so drafts are right often, not always), and hidden
// (h', p+1+fakeChained). Cache layer 1 (the MTP's) stores h'+1 at p for a
// row fed the target's hidden state (-1 for a chained draft row), and a
// call whose first row has the target's hidden state checks every row
// before it against the tokens in layer 0: an MTP cache row that is stale,
// or was overwritten by another sequence, fails loudly.
type fakeMTP struct {
	vocab int
	noise float32 // size of the MTP's error on the logits
	scale float32 // logit scale of the target

	// cost, if set, is slept at the start of every call: mtp tells
	// ForwardMTP from Forward, and tokens is the batch's tokens.
	cost func(mtp bool, tokens int) time.Duration

	mu        sync.Mutex
	forwards  int // Forward calls
	mtpCalls  int // ForwardMTP calls
	mtpRows   int // rows run by ForwardMTP
	maxVerify int // longest AllLogits chunk
}

// fakeHybrid is fakeMTP with a recurrent state: slot S holds h_{p-1}, and
// Forward checks it against the cache before every token, so a state that
// was not rolled back (or rolled back wrongly) fails loudly.
type fakeHybrid struct{ *fakeMTP }

func (fakeHybrid) StateLayout() []linattn.LayerShape {
	return []linattn.LayerShape{{Heads: 1, DK: 1, DV: 1, ConvK: 1}}
}

// fakeMod keeps hashes below 2^24, exact in a float32.
const fakeMod = 16777213

// fakeChained marks the position in a hidden state made by the MTP module
// (a chained draft row), as opposed to one made by the target.
const fakeChained = 1 << 20

func fakeMix(h uint64, tok int32) uint64 { return (h*31 + uint64(tok) + 7) % fakeMod }

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// fakeLogits are the target's logits for context hash h.
func (f *fakeMTP) fakeLogits(dst []float32, h uint64) {
	for v := range dst {
		dst[v] = f.scale * float32(splitmix(h*1315423911+uint64(v))>>40) / (1 << 24)
	}
}

// fakeHash is the context hash of tokens.
func fakeHash(tokens []int32) uint64 {
	var h uint64
	for _, t := range tokens {
		h = fakeMix(h, t)
	}
	return h
}

func (f *fakeMTP) Info() model.Info {
	return model.Info{Arch: "fake", Vocab: f.vocab, Hidden: 2, Layers: 1, MaxContext: 96, KVBytesPerToken: 16}
}

func (f *fakeMTP) CacheLayout() kvcache.Layout { return kvcache.Layout{{K: 1, V: 1}, {K: 1, V: 1}} }

func (f *fakeMTP) Forward(b *model.Batch) (*model.Output, error) { return f.forward(b, false) }

func (h fakeHybrid) Forward(b *model.Batch) (*model.Output, error) { return h.forward(b, true) }

func (f *fakeMTP) forward(b *model.Batch, state bool) (*model.Output, error) {
	if err := b.Validate(f.vocab, f.CacheLayout()); err != nil {
		return nil, err
	}
	if f.cost != nil {
		time.Sleep(f.cost(false, b.Tokens()))
	}
	f.mu.Lock()
	f.forwards++
	for _, s := range b.Seqs {
		if s.Logits == model.AllLogits {
			f.maxVerify = max(f.maxVerify, len(s.Tokens))
		}
	}
	f.mu.Unlock()
	out := &model.Output{Seqs: make([]model.SeqOutput, len(b.Seqs))}
	for i, s := range b.Seqs {
		if state && (b.States == nil || s.State == nil) {
			return nil, fmt.Errorf("fake: sequence %d has no state", i)
		}
		var st []float32
		if state {
			st = b.States.S(s.State, 0)
			if s.Pos == 0 {
				b.States.Reset(s.State)
			}
		}
		// The context before Pos, from the cache.
		var h uint64
		for p := range s.Pos {
			h = fakeMix(h, int32(b.Cache.K(0, s.KV, p)[0])-1)
		}
		if state && uint64(st[0]) != h {
			panic(fmt.Sprintf("fake: recurrent state %v at position %d, the cache says %d", st[0], s.Pos, h))
		}
		o := &out.Seqs[i]
		for j, tok := range s.Tokens {
			p := s.Pos + j
			b.Cache.K(0, s.KV, p)[0] = float32(tok + 1)
			h = fakeMix(h, tok)
			if state {
				st[0] = float32(h)
			}
			if s.Logits == model.AllLogits || s.Logits == model.LastLogits && j == len(s.Tokens)-1 {
				row := make([]float32, f.vocab)
				f.fakeLogits(row, h)
				o.Logits = append(o.Logits, row...)
			}
			if s.Hidden {
				o.Hidden = append(o.Hidden, float32(h), float32(p))
			}
		}
	}
	return out, nil
}

func (f *fakeMTP) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	if err := b.Validate(f.vocab, f.CacheLayout()); err != nil {
		return nil, err
	}
	if len(hidden) != len(b.Seqs) {
		return nil, fmt.Errorf("fake: %d hidden blocks for %d sequences", len(hidden), len(b.Seqs))
	}
	if f.cost != nil {
		time.Sleep(f.cost(true, b.Tokens()))
	}
	f.mu.Lock()
	f.mtpCalls++
	f.mtpRows += b.Tokens()
	f.mu.Unlock()
	out := &model.Output{Seqs: make([]model.SeqOutput, len(b.Seqs))}
	for i, s := range b.Seqs {
		if len(hidden[i]) != 2*len(s.Tokens) {
			return nil, fmt.Errorf("fake: sequence %d: %d hidden values for %d tokens", i, len(hidden[i]), len(s.Tokens))
		}
		o := &out.Seqs[i]
		if hidden[i][1] == float32(s.Pos) {
			// Fed by the target: the MTP rows before must be the right ones.
			var h uint64
			for p := range s.Pos {
				h = fakeMix(h, int32(b.Cache.K(0, s.KV, p)[0])-1)
				want := float32(fakeMix(h, int32(b.Cache.K(0, s.KV, p+1)[0])-1) + 1)
				if got := b.Cache.K(1, s.KV, p)[0]; got != want {
					panic(fmt.Sprintf("fake: MTP cache row %d is %v, want %v (call at position %d)", p, got, want, s.Pos))
				}
			}
		}
		for j, tok := range s.Tokens {
			p := s.Pos + j
			chained := hidden[i][2*j+1] == float32(p+fakeChained)
			if hidden[i][2*j+1] != float32(p) && !chained {
				return nil, fmt.Errorf("fake: MTP row at position %d got the hidden state of position %v", p, hidden[i][2*j+1])
			}
			h := fakeMix(uint64(hidden[i][2*j]), tok)
			b.Cache.K(1, s.KV, p)[0] = float32(h + 1)
			if chained {
				b.Cache.K(1, s.KV, p)[0] = -1
			}
			if s.Logits == model.AllLogits || s.Logits == model.LastLogits && j == len(s.Tokens)-1 {
				row := make([]float32, f.vocab)
				f.fakeLogits(row, h)
				for v := range row {
					row[v] += f.noise * (float32(splitmix(h^0xabcdef+uint64(v))>>40)/(1<<24) - 0.5)
				}
				o.Logits = append(o.Logits, row...)
			}
			if s.Hidden {
				o.Hidden = append(o.Hidden, float32(h), float32(p+1+fakeChained))
			}
		}
	}
	return out, nil
}

func (f *fakeMTP) counts() (forwards, mtpCalls, mtpRows, maxVerify int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forwards, f.mtpCalls, f.mtpRows, f.maxVerify
}
