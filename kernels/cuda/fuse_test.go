//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestNormFused checks the norm-fused GEMVs (NormLinearCat,
// NormSwiGLULinear, AddNormLinearCat) at model widths, fused
// (SetFuseNorm(true)) and as RMSNorm then the product: all within LinearTol of
// the references over the reference's normed rows, with the worst error logged as a fraction
// of its tolerance; and, with SetRowExact, every row of a 4-row call equal
// bit for bit to a call of that row alone (speculative == plain greedy).
func TestNormFused(t *testing.T) {
	t.Run("conformance", func(t *testing.T) { // kerneltest's cases of the Norm ops, fused
		b := openOps(t)
		b.SetFuseNorm(true)
		kerneltest.RunNormOps(t, b)
	})
	b := openOps(t)
	defer b.SetFuseNorm(false)
	logKernelResources(t, b.dev, "ferrite_gemv_bf16_1", "ferrite_gemv_norm_bf16", "ferrite_gemv_addnorm_bf16",
		"ferrite_gemv_swiglu_bf16", "ferrite_gemv_norm_swiglu_bf16", "ferrite_gemv_bf16_x", "ferrite_attn_bf16_4_g4",
		"ferrite_attn_qkv_bf16_4", "ferrite_attn_bf16_4")
	for _, c := range []struct {
		cols, q, kv, inter int
		offset             bool
	}{{4096, 4096, 1024, 1536, false}, {2048, 4096, 512, 768, true}} {
		rng := rand.New(rand.NewPCG(uint64(c.cols), 13))
		ws := []*kernels.Mat{kerneltest.NewMat(rng, kernels.BF16, c.q, c.cols, 0, 0),
			kerneltest.NewMat(rng, kernels.BF16, c.kv, c.cols, 0, 0), kerneltest.NewMat(rng, kernels.BF16, c.kv, c.cols, 0, 0)}
		gate, up := kerneltest.NewMat(rng, kernels.BF16, c.inter, c.cols, 0, 0), kerneltest.NewMat(rng, kernels.BF16, c.inter, c.cols, 0, 0)
		const rows = 4
		xv, wv := randF32(rng, rows*c.cols), randF32(rng, c.cols)
		for i := range wv {
			wv[i] *= 0.2
			if !c.offset {
				wv[i]++
			}
		}
		hn := &kernels.HeadNorm{W: f32Tensor(t, b, 1, c.cols, wv), Eps: 1e-6, Offset: c.offset}
		h := make([]float32, rows*c.cols)
		ref.RMSNorm(h, xv, wv, hn.Eps, c.offset, rows)
		total := c.q + 2*c.kv
		wantL := make([]float32, rows*total)
		ref.LinearCat(wantL, h, ws, nil, false, rows)
		var scaleL []float64 // Σ|h·w| per output, laid out as wantL
		abs := [][]float64{kerneltest.AbsDot(h, ws[0], rows), kerneltest.AbsDot(h, ws[1], rows), kerneltest.AbsDot(h, ws[2], rows)}
		for r := range rows {
			for i, w := range ws {
				scaleL = append(scaleL, abs[i][r*w.Rows:(r+1)*w.Rows]...)
			}
		}
		g, u, wantS := make([]float32, rows*c.inter), make([]float32, rows*c.inter), make([]float32, rows*c.inter)
		ref.Linear(g, h, gate, nil, false, rows)
		ref.Linear(u, h, up, nil, false, rows)
		ref.SwiGLUClamp(wantS, g, u, 0)
		ga, ua := kerneltest.AbsDot(h, gate, rows), kerneltest.AbsDot(h, up, rows)
		// run returns both ops' outputs for rows [r0, r0+n) of x. It also
		// runs AddNormLinearCat on halves of x, which add up to x exactly,
		// and checks that it gives NormLinearCat's bits and the sum x.
		run := func(n, r0 int) (lin, sw []float32) {
			xs := xv[r0*c.cols : (r0+n)*c.cols]
			half := make([]float32, len(xs))
			for i, v := range xs {
				half[i] = 0.5 * v
			}
			x, xa, xd := f32Tensor(t, b, n, c.cols, xs), f32Tensor(t, b, n, c.cols, half), f32Tensor(t, b, n, c.cols, half)
			sm := f32Tensor(t, b, n, c.cols, make([]float32, len(xs)))
			yl, ys := f32Tensor(t, b, n, total, make([]float32, n*total)), f32Tensor(t, b, n, c.inter, make([]float32, n*c.inter))
			ya := f32Tensor(t, b, n, total, make([]float32, n*total))
			b.BeginStep()
			b.NormLinearCat(yl, x, hn, ws, kernels.Epilogue{})
			b.NormSwiGLULinear(ys, x, hn, gate, up, 0)
			b.AddNormLinearCat(ya, sm, xa, xd, hn, ws, kernels.Epilogue{})
			b.EndStep()
			lin, sw = make([]float32, n*total), make([]float32, n*c.inter)
			la, sa := make([]float32, n*total), make([]float32, len(xs))
			b.ReadF32(lin, yl)
			b.ReadF32(sw, ys)
			b.ReadF32(la, ya)
			b.ReadF32(sa, sm)
			if !slices.Equal(sa, xs) {
				t.Errorf("cols %d, %d rows: AddNormLinearCat's sum is not x", c.cols, n)
			}
			for i, v := range la {
				if math.Float32bits(v) != math.Float32bits(lin[i]) {
					t.Errorf("cols %d, %d rows: AddNormLinearCat y[%d] = %g, NormLinearCat %g", c.cols, n, i, v, lin[i])
					break
				}
			}
			for _, tt := range []kernels.Tensor{x, xa, xd, sm, yl, ys, ya} {
				b.Free(tt)
			}
			return lin, sw
		}
		for _, mode := range []string{"fused", "unfused"} {
			b.SetFuseNorm(mode == "fused")
			name := fmt.Sprintf("cols %d offset %v %s", c.cols, c.offset, mode)
			lin, sw := run(1, 0)
			worst := 0.0
			for i, v := range lin {
				lim := kerneltest.LinearTol * (scaleL[i] + 1e-30)
				d := math.Abs(float64(v - wantL[i]))
				worst = max(worst, d/lim)
				if !(d <= lim) {
					t.Errorf("%s: NormLinearCat y[%d] = %g, want %g ± %.3g", name, i, v, wantL[i], lim)
					break
				}
			}
			worstS := 0.0
			for i, v := range sw {
				lim := kerneltest.LinearTol*(1.1*ga[i]*math.Abs(float64(u[i]))+ua[i]*math.Abs(float64(g[i]))+ga[i]*ua[i]) +
					kerneltest.RowOpTol*max(1, math.Abs(float64(wantS[i])))
				d := math.Abs(float64(v - wantS[i]))
				worstS = max(worstS, d/lim)
				if !(d <= lim) {
					t.Errorf("%s: NormSwiGLULinear y[%d] = %g, want %g ± %.3g", name, i, v, wantS[i], lim)
					break
				}
			}
			t.Logf("%s: worst error %.3f (NormLinearCat), %.3f (NormSwiGLULinear) of the tolerance", name, worst, worstS)
			kernels.SetRowExact(b, true)
			linN, swN := run(rows, 0)
			kernels.SetRowExact(b, false)
			for r := range rows {
				l1, s1 := run(1, r)
				for i, v := range l1 {
					if math.Float32bits(v) != math.Float32bits(linN[r*total+i]) {
						t.Errorf("%s: row-exact NormLinearCat row %d [%d] = %g, %g alone", name, r, i, linN[r*total+i], v)
						break
					}
				}
				for i, v := range s1 {
					if math.Float32bits(v) != math.Float32bits(swN[r*c.inter+i]) {
						t.Errorf("%s: row-exact NormSwiGLULinear row %d [%d] = %g, %g alone", name, r, i, swN[r*c.inter+i], v)
						break
					}
				}
			}
		}
	}
}

// logKernelResources logs the registers and local (spill) bytes a thread
// of each named kernel uses, where the driver has cuFuncGetAttribute: what
// bounds the GEMVs' resident blocks (65,536 registers a multiprocessor).
func logKernelResources(t *testing.T, d *Device, names ...string) {
	if driver.cuFuncGetAttribute == 0 {
		t.Log("no cuFuncGetAttribute: kernel resources not logged")
		return
	}
	const attrLocalBytes, attrRegs = 3, 4 // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, _NUM_REGS
	for _, name := range names {
		var regs, local int32
		err := d.do(func() error {
			fn := d.fns[name]
			if fn == 0 {
				return fmt.Errorf("no kernel %s", name)
			}
			if err := check("cuFuncGetAttribute", call(driver.cuFuncGetAttribute, uintptr(unsafe.Pointer(&regs)), attrRegs, fn)); err != nil {
				return err
			}
			return check("cuFuncGetAttribute", call(driver.cuFuncGetAttribute, uintptr(unsafe.Pointer(&local)), attrLocalBytes, fn))
		})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		t.Logf("%s: %d registers a thread (%d blocks of 256 a multiprocessor), %d local bytes", name, regs, 65536/(256*max(int(regs), 1)), local)
	}
}

// TestOpsFusedAttention runs kerneltest's attention cases with the fused
// attention on (SetFuse: QKVAttention's one kernel, the split merge in the
// attention kernel), which is off by default.
func TestOpsFusedAttention(t *testing.T) {
	b := openOps(t)
	b.SetFuse(true)
	kerneltest.RunAttentionOps(t, b)
}
