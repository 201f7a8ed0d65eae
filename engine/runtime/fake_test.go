package runtime_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
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

	devOnce sync.Once
	dev     *strict.Device // holds the cache and state storage (Device)

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

// Device makes the fake a model.DeviceModel: its cache and state pool live
// in a strict device's tensors, which it reads and writes between steps.
func (f *fakeMTP) Device() kernels.Device {
	f.devOnce.Do(func() { f.dev = strict.New() })
	return f.dev
}

// SetCacheDType accepts the fake's one cache type, F32.
func (f *fakeMTP) SetCacheDType(dt kernels.DType) error {
	if dt != kernels.F32 {
		return fmt.Errorf("fake: %v cache", dt)
	}
	return nil
}

// row is row i of t, one value wide (the fake's K and S widths).
func row(t kernels.Tensor, i int) kernels.Tensor { return t.Slice(i, i+1) }

// getK is value 0 of layer l's K at position p of s.
func getK(c *kvcache.Cache, l int, s *kvcache.Seq, p int) float32 {
	k, _ := c.Layer(l)
	v := make([]float32, 1)
	c.Memory().ReadF32(v, row(k, int(c.Slot(s, p))))
	return v[0]
}

// setK sets value 0 of layer l's K at position p of s.
func setK(c *kvcache.Cache, l int, s *kvcache.Seq, p int, v float32) {
	k, _ := c.Layer(l)
	c.Memory().WriteF32(row(k, int(c.Slot(s, p))), []float32{v})
}

// getState and setState read and write value 0 of slot st's S in layer 0.
func getState(p *linattn.StatePool, st *linattn.Slot) float32 {
	s, _ := p.Tensors(0)
	v := make([]float32, 1)
	p.Memory().ReadF32(v, row(s, p.Row(st)))
	return v[0]
}

func setState(p *linattn.StatePool, st *linattn.Slot, v float32) {
	s, _ := p.Tensors(0)
	p.Memory().WriteF32(row(s, p.Row(st)), []float32{v})
}

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
		if state {
			if s.Pos == 0 {
				b.States.Reset(s.State)
			}
		}
		// The context before Pos, from the cache.
		var h uint64
		for p := range s.Pos {
			h = fakeMix(h, int32(getK(b.Cache, 0, s.KV, p))-1)
		}
		if state {
			if st := getState(b.States, s.State); uint64(st) != h {
				panic(fmt.Sprintf("fake: recurrent state %v at position %d, the cache says %d", st, s.Pos, h))
			}
		}
		o := &out.Seqs[i]
		for j, tok := range s.Tokens {
			p := s.Pos + j
			setK(b.Cache, 0, s.KV, p, float32(tok+1))
			h = fakeMix(h, tok)
			if state {
				setState(b.States, s.State, float32(h))
				if j < len(s.Record) && s.Record[j] != nil {
					b.States.Snapshot(s.Record[j], s.State)
				}
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
				h = fakeMix(h, int32(getK(b.Cache, 0, s.KV, p))-1)
				want := float32(fakeMix(h, int32(getK(b.Cache, 0, s.KV, p+1))-1) + 1)
				if got := getK(b.Cache, 1, s.KV, p); got != want {
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
			if chained {
				setK(b.Cache, 1, s.KV, p, -1)
			} else {
				setK(b.Cache, 1, s.KV, p, float32(h+1))
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
