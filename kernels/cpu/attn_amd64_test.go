//go:build !noasm

package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The attention kernels of attn_amd64.s against their Go twins, at lengths
// that leave every tail size, with the gaps between strided rows checked
// untouched. (The conformance suite covers them inside Attention and
// SwiGLU; these tests name the kernel that breaks.)

func skipNoAVX2(t *testing.T) {
	if !cpuinfo.AVX2FMA() {
		t.Skip("no AVX2/FMA")
	}
}

// TestSoftmaxMatchesGo checks softmaxF32 against softmax: the exp
// polynomial is the same (fused multiply-adds aside) and both sum in
// float64, so they agree to a few float32 ulp; lanes below −87 are 0 in both.
func TestSoftmaxMatchesGo(t *testing.T) {
	skipNoAVX2(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 513} {
		for _, spread := range []float64{1, 30, 300} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * spread)
			}
			want := append([]float32(nil), x...)
			softmax(want, 0.125)
			got := append([]float32(nil), x...)
			softmaxF32(got, 0.125)
			var sum float64
			for i := range got {
				sum += float64(got[i])
				if d := math.Abs(float64(got[i] - want[i])); d > 4e-7*math.Abs(float64(want[i]))+1e-30 || (want[i] == 0) != (got[i] == 0) {
					t.Fatalf("n=%d spread %g: x[%d]=%g: %g, Go %g", n, spread, i, x[i], got[i], want[i])
				}
			}
			if math.Abs(sum-1) > 1e-6 {
				t.Errorf("n=%d spread %g: sums to %g", n, spread, sum)
			}
		}
	}
	softmaxF32(nil, 1) // no element: nothing read or written
}

// TestExpSumMatchesGo checks scaledMaxF32 and expSumF32 (the split
// softmax of rows) against their Go twins: the same maximum, exponentials
// within a few float32 ulp (the fused multiply-subtract aside), lanes below
// −87 0 in both, and sums within float32 rounding of each other.
func TestExpSumMatchesGo(t *testing.T) {
	skipNoAVX2(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 513} {
		for _, spread := range []float64{1, 30, 300} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * spread)
			}
			m, mg := scaledMaxF32(x, 0.125), scaledMaxGo(x, 0.125)
			if m != mg {
				t.Fatalf("n=%d spread %g: max %g, Go %g", n, spread, m, mg)
			}
			if n == 0 {
				if !math.IsInf(float64(m), -1) || expSumF32(nil, 1, 0) != 0 {
					t.Fatalf("empty: max %g", m)
				}
				continue
			}
			want := append([]float32(nil), x...)
			sg := expSumGo(want, 0.125, m)
			got := append(make([]float32, 0, n+1), x...)
			got = append(got, -1)[:n] // a guard past the end
			s := expSumF32(got, 0.125, m)
			if got[:n+1][n] != -1 {
				t.Fatalf("n=%d: wrote past the end", n)
			}
			for i := range got {
				if d := math.Abs(float64(got[i] - want[i])); d > 4e-7*math.Abs(float64(want[i]))+1e-30 || (want[i] == 0) != (got[i] == 0) {
					t.Fatalf("n=%d spread %g: x[%d]=%g: %g, Go %g", n, spread, i, x[i], got[i], want[i])
				}
			}
			if math.Abs(s-sg) > 1e-6*sg || s < 1 {
				t.Errorf("n=%d spread %g: sum %g, Go %g", n, spread, s, sg)
			}
		}
	}
}

// TestSwiGLUMatchesRef checks swigluF32 against ref.SwiGLU (float64 exp),
// in place too, over arguments far into both tails of the sigmoid.
func TestSwiGLUMatchesRef(t *testing.T) {
	skipNoAVX2(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 7, 8, 9, 23, 64, 1000} {
		g, u := make([]float32, n), make([]float32, n)
		for i := range g {
			g[i] = float32(rng.NormFloat64() * 8)
			u[i] = float32(rng.NormFloat64())
		}
		if n > 3 {
			g[0], g[1], g[2] = 100, -100, 0
		}
		want := make([]float32, n)
		ref.SwiGLU(want, g, u)
		y := make([]float32, n+1)
		y[n] = -1
		swigluF32(y, g, u)
		if y[n] != -1 {
			t.Fatalf("n=%d: wrote past the end", n)
		}
		swigluF32(g, g, u) // in place
		for i := range want {
			lim := 1e-6 * max(1, math.Abs(float64(want[i])))
			for _, got := range []float32{y[i], g[i]} {
				if math.Abs(float64(got-want[i])) > lim {
					t.Fatalf("n=%d: y[%d] = %g, ref %g", n, i, got, want[i])
				}
			}
		}
	}
}

// TestPVMatchesGo checks the attnPV kernels (through pv, AVX-512 where
// the CPU has it and with it switched off) against pvGo: both sum over the
// keys in order, so they differ only by the fused multiply-add's rounding.
func TestPVMatchesGo(t *testing.T) {
	skipNoAVX2(t)
	t.Run("AVX512", testPVMatchesGo)
	t.Run("AVX2", func(t *testing.T) {
		defer cpuinfo.DisableAVX512()()
		testPVMatchesGo(t)
	})
}

func testPVMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, hd := range []int{32, 64, 96, 128, 256} {
			for _, rows := range []int{1, 2} {
				for _, n := range []int{0, 1, 5, 77} {
					t.Run(fmt.Sprintf("%v/hd=%d/rows=%d/n=%d", dt, hd, rows, n), func(t *testing.T) {
						const slots, ldo, ldp = 100, 300, 90
						esz := dt.Size()
						ldv := 2*hd + 8 // two heads and a gap per slot
						v := make([]byte, slots*ldv*esz)
						for i := range slots * ldv {
							x := float32(rng.NormFloat64())
							if dt == kernels.BF16 {
								binary.LittleEndian.PutUint16(v[2*i:], kernels.F32ToBF16(x))
							} else {
								binary.LittleEndian.PutUint32(v[4*i:], math.Float32bits(x))
							}
						}
						offs := make([]int, n)
						for i := range offs {
							offs[i] = rng.IntN(slots)*ldv + hd // the second head
						}
						p := make([]float32, (rows-1)*ldp+n)
						for i := range p {
							p[i] = rng.Float32()
						}
						want := make([]float32, (rows-1)*ldo+hd)
						for i := range want {
							want[i] = 0.5 // both add to o
						}
						pvGo(dt, want, ldo, p, ldp, v, offs, hd, rows)
						got := make([]float32, len(want)+1)
						for i := range got {
							got[i] = -1
							if i%ldo < hd && i < len(want) {
								got[i] = 0.5
							}
						}
						pv(dt, got, ldo, p, ldp, v, offs, hd, rows)
						for r := range rows {
							for c := range hd {
								i := r*ldo + c
								if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*float64(n) {
									t.Fatalf("o[%d][%d] = %g, Go %g", r, c, got[i], want[i])
								}
							}
						}
						for i, x := range got {
							if (i%ldo >= hd || i >= rows*ldo || i >= len(want)) && x != -1 {
								t.Fatalf("o[%d] written outside the rows", i)
							}
						}
					})
				}
			}
		}
	}
}

// TestRMSNormMatchesRef checks rmsNorm (sumSquaresF64, normScaleF32)
// against ref.RMSNorm: the same roundings, the float64 sum in another
// order, so at most an ulp apart; in place too.
func TestRMSNormMatchesRef(t *testing.T) {
	skipNoAVX2(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const rows = 3
	for _, d := range []int{1, 7, 8, 9, 128, 1000} {
		for _, offset := range []bool{false, true} {
			x, w := make([]float32, rows*d), make([]float32, d)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 3)
			}
			for i := range w {
				w[i] = float32(rng.NormFloat64())
			}
			want := make([]float32, rows*d)
			ref.RMSNorm(want, x, w, 1e-6, offset, rows)
			got := make([]float32, rows*d+1)
			got[rows*d] = -1
			rmsNorm(got, x, w, 1e-6, offset, rows)
			rmsNorm(x, x, w, 1e-6, offset, rows) // in place
			if got[rows*d] != -1 {
				t.Fatalf("d=%d: wrote past the rows", d)
			}
			for i := range want {
				lim := 2e-7 * math.Abs(float64(want[i]))
				if math.Abs(float64(got[i]-want[i])) > lim || math.Abs(float64(x[i]-want[i])) > lim {
					t.Fatalf("d=%d offset %v: y[%d] = %g (in place %g), ref %g", d, offset, i, got[i], x[i], want[i])
				}
			}
		}
	}
}
