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
// moePipeDyn), else 0 (off).
func pipeMode(v string) int {
	switch v {
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

// usePipe reports whether n tokens of k slots each take the streamed
// kernels: with c.pipe, from moeGTFrom tokens (c.tiles slots when set) up
// to moePipeSlots slots, on a device whose blocks may take moePipeSmem.
func (b *Backend) usePipe(n, k int) bool {
	c := b.moe
	if c.pipe == 0 || n*k > moePipeSlots || b.dev.SmemOptIn < moePipeSmem {
		return false
	}
	if c.tiles > 0 && n*k >= c.tiles {
		return true
	}
	return n >= moeGTFrom
}

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
	suffix, threads := "", uint32(256)
	if b.moe.pipe&^moePipeDyn == 16 {
		suffix, threads = "_w16", 512
	}
	var ctr uint64 // (4) the dynamic kernels' item counters: gate/up's, down's
	if b.moe.pipe&moePipeDyn != 0 {
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
		return d.launchL("ferrite_moe_combine", uint32(n), 256, 0, y, i32(dst.Stride), ye, ip, wp, i32(k), i32(hidden))
	})
}
