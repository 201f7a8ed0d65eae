package nn

import (
	"errors"
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Weights is the tensor source layers load from. *weights.Set satisfies it,
// and so does a random-weight source for benchmarks.
type Weights interface {
	// Has reports whether the checkpoint holds the tensor name.
	Has(name string) bool
	// Mat returns the 2-D tensor name, shape-checked to (rows, cols).
	Mat(name string, rows, cols int) (*kernels.Mat, error)
	// Expert returns slice e, shape (rows, cols), of the fused 3-D tensor name.
	Expert(name string, e, rows, cols int) (*kernels.Mat, error)
	// Float32 returns a small tensor of exactly shape, converted to float32.
	Float32(name string, shape ...int) ([]float32, error)
}

// maxLoadErrors is how many load errors Loader.Err spells out.
const maxLoadErrors = 8

// Loader loads layers from Weights and records every failure, so that a
// model constructor can load everything and check Err once. After a failure
// the returned value is an empty placeholder, never nil.
type Loader struct {
	W    Weights
	errs []error
	n    int

	placeholders int // floats handed out as placeholders so far
}

// NewLoader returns a Loader reading from w.
func NewLoader(w Weights) *Loader { return &Loader{W: w} }

// Fail records err (ignored when nil).
func (l *Loader) Fail(err error) {
	if err == nil {
		return
	}
	if l.n < maxLoadErrors {
		l.errs = append(l.errs, err)
	}
	l.n++
}

// Failf records a formatted error.
func (l *Loader) Failf(format string, args ...any) { l.Fail(fmt.Errorf(format, args...)) }

// Err returns the recorded failures joined, or nil.
func (l *Loader) Err() error {
	if l.n == 0 {
		return nil
	}
	errs := l.errs
	if l.n > len(errs) {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("and %d more load errors", l.n-len(errs)))
	}
	return errors.Join(errs...)
}

// failFast is the number of failures after which the Loader stops looking
// tensors up: the model is lost already, and a damaged layer or expert count
// could otherwise make the constructor look up (and spell out errors for)
// millions of missing tensors.
const failFast = 1 << 12

// lost reports whether failFast failures have been recorded; it counts one
// more.
func (l *Loader) lost() bool {
	if l.n < failFast {
		return false
	}
	l.n++
	return true
}

// Has reports whether the tensor name exists.
func (l *Loader) Has(name string) bool { return l.W.Has(name) }

// Mat loads the 2-D tensor name of shape (rows, cols).
func (l *Loader) Mat(name string, rows, cols int) *kernels.Mat {
	if l.lost() {
		return &kernels.Mat{}
	}
	m, err := l.W.Mat(name, rows, cols)
	if err != nil {
		l.Fail(err)
		return &kernels.Mat{}
	}
	return m
}

// Expert loads slice e, shape (rows, cols), of the fused tensor name.
func (l *Loader) Expert(name string, e, rows, cols int) *kernels.Mat {
	if l.lost() {
		return &kernels.Mat{}
	}
	m, err := l.W.Expert(name, e, rows, cols)
	if err != nil {
		l.Fail(err)
		return &kernels.Mat{}
	}
	return m
}

// maxPlaceholders bounds the floats of all the placeholders one Loader
// returns after failures: their sizes come from config.json, which may be
// damaged (a layer count of thousands times a width of thousands), and a
// model that failed to load is never run, so they need not be full size.
const maxPlaceholders = 1 << 22

// Vec loads the 1-D tensor name of n values as float32.
func (l *Loader) Vec(name string, n int) []float32 { return l.Tensor(name, n) }

// Tensor loads the small tensor name of exactly shape as float32. After a
// failure it returns zeros: as many as shape holds while the Loader's
// placeholders stay within maxPlaceholders, none after that.
func (l *Loader) Tensor(name string, shape ...int) []float32 {
	if l.lost() {
		return nil
	}
	v, err := l.W.Float32(name, shape...)
	if err == nil {
		return v
	}
	l.Fail(err)
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil
		}
		if n > maxPlaceholders/d {
			return nil
		}
		n *= d
	}
	if l.placeholders+n > maxPlaceholders {
		return nil
	}
	l.placeholders += n
	return make([]float32, n)
}

// Linear loads name+".weight" (out, in) and, when bias is set,
// name+".bias" (out).
func (l *Loader) Linear(name string, out, in int, bias bool) *Linear {
	lin := &Linear{W: l.Mat(name+".weight", out, in)}
	if bias {
		lin.B = l.Vec(name+".bias", out)
	}
	return lin
}

// RMSNorm loads name+".weight" (dim) as an RMSNorm; offset selects the
// zero-centred (1+w) form.
func (l *Loader) RMSNorm(name string, dim int, eps float32, offset bool) *RMSNorm {
	return &RMSNorm{W: l.Vec(name+".weight", dim), Eps: eps, Offset: offset}
}

// MLPNames are a checkpoint's names for the three SwiGLU projections.
type MLPNames struct{ Gate, Up, Down string }

// HFNames are Hugging Face's usual SwiGLU names; Mixtral's experts use
// MixtralNames.
var (
	HFNames      = MLPNames{"gate_proj", "up_proj", "down_proj"}
	MixtralNames = MLPNames{"w1", "w3", "w2"}
)

// MLP loads a SwiGLU MLP under prefix ("model.layers.3.mlp"), with biases
// on all three projections when bias is set.
func (l *Loader) MLP(prefix string, names MLPNames, hidden, inter int, bias bool) *MLP {
	return &MLP{
		Gate: l.Linear(prefix+"."+names.Gate, inter, hidden, bias),
		Up:   l.Linear(prefix+"."+names.Up, inter, hidden, bias),
		Down: l.Linear(prefix+"."+names.Down, hidden, inter, bias),
	}
}

// Experts loads n routed experts under prefix ("model.layers.3.mlp.experts")
// from either storage Hugging Face uses: fused tensors prefix.gate_up_proj
// (n, 2·inter, hidden) and prefix.down_proj (n, hidden, inter), or one set
// of projections per expert, prefix.{e}.{names}.weight.
func (l *Loader) Experts(prefix string, names MLPNames, n, hidden, inter int) []Expert {
	ex := make([]Expert, n)
	if l.Has(prefix + ".gate_up_proj") {
		for e := range ex {
			ex[e] = Expert{
				GateUp: l.Expert(prefix+".gate_up_proj", e, 2*inter, hidden),
				Down:   l.Expert(prefix+".down_proj", e, hidden, inter),
			}
		}
		return ex
	}
	for e := range ex {
		p := fmt.Sprintf("%s.%d.", prefix, e)
		ex[e] = Expert{
			Gate: l.Mat(p+names.Gate+".weight", inter, hidden),
			Up:   l.Mat(p+names.Up+".weight", inter, hidden),
			Down: l.Mat(p+names.Down+".weight", hidden, inter),
		}
	}
	return ex
}
