package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkMLAProjections times the absorbed MLA decode's per-head
// projections, one row (W_UK_hᵀ·q_nope and W_UV_h·lat, the two MatMuls a
// head of AttentionMLA's absorbed form makes), at GLM-4.7-Flash's shape
// (20 heads, nope 192, v 256, kv_lora 512) over 16 layers (their weights
// far more than the caches hold), on the per-head matrices as the CPU
// backend holds them: "f32" the float32 split it makes of a kv_b_proj
// that a GGUF stores in blocks (rebuilt as F32), "q8_0" the file's
// attn_k_b and attn_v_b blocks as stored (Mat.KVB).
func BenchmarkMLAProjections(b *testing.B) {
	const layers, heads, nope, v, kl = 16, 20, 192, 256, 512
	be := cpu.New(0)
	defer be.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	uk := make([][]*kernels.Mat, layers) // (heads) each (kl, nope)
	uv := make([][]*kernels.Mat, layers) // (heads) each (v, kl)
	for l := range layers {
		for range heads {
			uk[l] = append(uk[l], kerneltest.NewMat(rng, kernels.F32, kl, nope, 0, 0))
			uv[l] = append(uv[l], kerneltest.NewMat(rng, kernels.F32, v, kl, 0, 0))
		}
	}
	q := make([]float32, nope)
	lat := make([]float32, kl)
	out := make([]float32, max(kl, v))
	for i := range q {
		q[i] = rng.Float32()
	}
	for i := range lat {
		lat[i] = rng.Float32()
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.Q8_0} {
		mk, mv := uk, uv
		if dt != kernels.F32 {
			mk, mv = make([][]*kernels.Mat, layers), make([][]*kernels.Mat, layers)
			for l := range layers {
				for h := range heads {
					k, err := kernels.Quantize(uk[l][h], dt)
					if err != nil {
						b.Fatal(err)
					}
					w, err := kernels.Quantize(uv[l][h], dt)
					if err != nil {
						b.Fatal(err)
					}
					mk[l], mv[l] = append(mk[l], k), append(mv[l], w)
				}
			}
		}
		bytes := int64(layers*heads) * int64(kl*dt.RowBytes(nope)+v*dt.RowBytes(kl))
		b.Run(dt.String(), func(b *testing.B) {
			step := func() {
				for l := range layers {
					for h := range heads {
						be.MatMul(out[:kl], q, mk[l][h], 1)
						be.MatMul(out[:v], lat, mv[l][h], 1)
					}
				}
			}
			step() // the backend's one-time forms
			b.SetBytes(bytes)
			b.ResetTimer()
			for range b.N {
				step()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/layers, "µs/layer")
		})
		// The same products as AttentionMLA now runs them: a layer's heads
		// side by side over the workers (headMatMuls), W_UK's then W_UV's.
		qs, lats := make([]float32, heads*nope), make([]float32, heads*kl)
		for h := range heads {
			copy(qs[h*nope:], q)
			copy(lats[h*kl:], lat)
		}
		ys := make([]float32, heads*max(kl, v))
		b.Run(dt.String()+"/heads", func(b *testing.B) {
			step := func() {
				for l := range layers {
					be.HeadMatMuls(ys, kl, qs, nope, mk[l], 1)
					be.HeadMatMuls(ys, v, lats, kl, mv[l], 1)
				}
			}
			step()
			b.SetBytes(bytes)
			b.ResetTimer()
			for range b.N {
				step()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/layers, "µs/layer")
		})
	}
}
