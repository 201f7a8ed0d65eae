//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ferrite-llm/ferrite/kernels"

// The streamed grouped experts (src/ops_moe_pipe.cu): for decode batches
// from moeGTFrom tokens up to moePipeSlots slots, every block resident for
// the call and the experts' bf16 weights copied through a ring of
// shared-memory stages with cp.async, so far more bytes are in flight than
// the register tiles (ferrite_moe_gt_*) hold. Every output is summed as
// the one-token kernels sum it (kernels.RowExact holds as for the register
// tiles). FERRITE_MOE_KERNELS=pipe, pipe16, piped or pipe16d turns it on
// (pipeMode).
const (
	moePipeSlots = 512                         // the most slots (tokens · k) a call
	moePipeSmem  = 4*40960 + (1024+5*512+12)*4 // dynamic shared memory a block: kPipeStages · PipeShape::kStage + kPipeSmemSort (none static)
	moePipeDyn   = 1                           // moeConfig.pipe's bit for the kernels that take items dynamically
	moePipeAuto  = 16 | moePipeDyn             // the form Experts runs above moeGTTokens tokens unless told otherwise
)

func init() {
	var names []string
	for _, w := range []string{"", "_w16"} {
		for _, d := range []string{"", "_dyn"} {
			names = append(names, "ferrite_moe_pipe_gate_up"+w+d, "ferrite_moe_pipe_down"+w+d)
		}
	}
	kernelNames = append(kernelNames, names...)
	bigSmemKernels = append(bigSmemKernels, names...)
	for _, n := range names {
		pdlKernels[n] = true
	}
}

// pipeMode reads FERRITE_MOE_KERNELS for the streamed kernels: "pipe" 8
// warps a block, "pipe16" 16 (the same rows an item, half as many a warp),
// "piped" and "pipe16d" the same with the items taken dynamically (plus
// moePipeDyn), "nopipe" −1 (never), else 0 (moePipeAuto above
// moeGTTokens tokens only).
func pipeMode(v string) int {
	switch v {
	case "nopipe":
		return -1
	case "pipe":
		return 8
	case "pipe16":
		return 16
	case "piped":
		return 8 | moePipeDyn
	case "pipe16d":
		return 16 | moePipeDyn
	}
	return 0
}

// pipeFor returns the streamed kernels' form (pipeMode) for n tokens of k
// slots each, 0 for none: up to moePipeSlots slots on a device whose
// blocks may take moePipeSmem, with c.pipe set from moeGTFrom tokens
// (c.tiles slots when set), else moePipeAuto where the sorted tiles would
// run (above moeGTTokens and the register tiles' FERRITE_MOE_FEW, not
// with FERRITE_MOE_KERNELS=v1): GPU run 1 (BenchmarkMoEGLM, 64 tokens)
// took 692 µs a layer there against the tiles' 1,079, while the register
// tiles stayed ahead up to 32 tokens (416 against 520).
func (b *Backend) pipeFor(n, k int) int {
	c := b.moe
	if c.pipe < 0 || n*k > moePipeSlots || b.dev.SmemOptIn < moePipeSmem {
		return 0
	}
	if c.pipe > 0 {
		if (c.tiles > 0 && n*k >= c.tiles) || n >= moeGTFrom {
			return c.pipe
		}
		return 0
	}
	if !c.v1 && n > max(moeGTTokens, c.few) {
		return moePipeAuto
	}
	return 0
}

// usePipe reports whether n tokens of k slots each take the streamed
// kernels (pipeFor).
func (b *Backend) usePipe(n, k int) bool { return b.pipeFor(n, k) != 0 }

// pipeFits reports whether experts suit the streamed kernels: every
// weight bf16, widths of 8s (16-byte rows) and x's stride a multiple of 4.
func pipeFits(experts []kernels.Expert, hidden, inter, xStride int) bool {
	if hidden%8 != 0 || inter%8 != 0 || xStride%4 != 0 {
		return false
	}
	for _, ex := range experts {
		if ex.GateUp != nil {
			if ex.GateUp.DType != kernels.BF16 {
				return false
			}
		} else if ex.Gate.DType != kernels.BF16 || ex.Up.DType != kernels.BF16 {
			return false
		}
		if ex.Down.DType != kernels.BF16 {
			return false
		}
	}
	return true
}

// expertsPipe queues the streamed kernels and ferrite_moe_combine for
// runExperts: h (n·k, inter) its scratch, table the experts' descriptors.
func (b *Backend) expertsPipe(dst, x kernels.Tensor, ip, wp, h uint64, table *Buffer, ne, n, k, hidden, inter int, limit float32) {
	slots, sms := n*k, uint32(b.dev.SMs)
	ye := dptr(b.Scratch(kernels.F32, slots, hidden)) // (n·k, hidden) each slot's expert output
	y, xp := dptr(dst), dptr(x)
	mode := b.pipeFor(n, k)
	suffix, threads := "", uint32(256)
	if mode&^moePipeDyn == 16 {
		suffix, threads = "_w16", 512
	}
	var ctr uint64 // (4) the dynamic kernels' item counters: gate/up's, down's
	if mode&moePipeDyn != 0 {
		suffix += "_dyn"
		if !b.moePipeCnt.Valid() {
			t, err := b.Alloc(kernels.I32, 1, 4)
			if err != nil {
				b.fail(err)
				return
			}
			b.moePipeCnt = t
		}
		ctr = dptr(b.moePipeCnt)
	}
	parts := b.combineParts(n, hidden)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_moe_pipe_gate_up"+suffix, sms, threads, moePipeSmem,
			h, i32(inter), xp, i32(x.Stride), ip, table.ptr, i32(ne), i32(k), i32(slots), i32(hidden), f32(limit), ctr)
		if err == nil {
			err = d.launchL("ferrite_moe_pipe_down"+suffix, sms, threads, moePipeSmem,
				ye, i32(hidden), h, ip, table.ptr, i32(ne), i32(k), i32(slots), i32(inter), ctr+8)
		}
		if err != nil {
			return err
		}
		return d.moeCombine(y, dst.Stride, ye, ip, wp, n, k, hidden, parts)
	})
}
