//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestProfTable checks the profile table's bookkeeping and text without a
// GPU: rows keyed by label, counts and sums, sorting by total time, the
// per-step columns, the starved share, the total row and the idle time.
func TestProfTable(t *testing.T) {
	var tb profTable
	gemv := profKey{name: "ferrite_gemv_bf16_1", dims: [3]uint32{1024, 1, 1}, block: 256}
	gemv2 := profKey{name: "ferrite_gemv_bf16_1", dims: [3]uint32{512, 1, 1}, block: 256}
	gemm := profKey{kind: profGemm, dims: [3]uint32{128, 4096, 4096}}
	up := profKey{kind: profHtoD, size: 4096}
	for range 4 {
		tb.add(tb.row(gemv), 10, 0.2)
	}
	tb.add(tb.row(gemm), 100, -1)
	tb.add(tb.row(gemm), 60, 3)
	tb.add(tb.row(up), 2, 1)
	tb.add(tb.row(gemv2), 30, 0)
	if tb.row(gemv) != 0 || tb.row(gemm) != 1 || len(tb.rows) != 4 || tb.rows[1].starved != 1 || tb.rows[2].starved != 1 {
		t.Fatalf("rows %+v: a key did not keep its row", tb.rows)
	}
	if g := tb.rows[0]; g.calls != 4 || g.us != 40 {
		t.Fatalf("gemv row %+v, want 4 calls, 40 µs", g)
	}
	tb.steps = 2
	var sb strings.Builder
	if err := tb.write(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	t.Log("\n" + out)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	// Gaps: gemv 4 × 0.2 µs and 0 (not starved), gemm unmeasured and 3 µs,
	// the copy 1 µs (starved from starvedUs on): 4.8 µs idle. Total 232 µs.
	header := []string{"kernel", "calls", "calls/step", "µs/call", "µs/step", "%", "starved%"}
	total := []string{"total", "(2", "steps)", "8", "4.0", "29.00", "116.0", "100.0", "25"}
	want := [][]string{
		{"by", "kernel:"},
		header,
		{"cublasLt", "2", "1.0", "80.00", "80.0", "69.0", "50"},
		{"gemv_bf16_1", "5", "2.5", "14.00", "35.0", "30.2", "0"},
		{"memcpy", "HtoD", "1", "0.5", "2.00", "1.0", "0.9", "100"},
		total,
		{"by", "launch", "shape:"},
		header,
		{"cublasLt", "m=128", "n=4096", "k=4096", "2", "1.0", "80.00", "80.0", "69.0", "50"},
		{"gemv_bf16_1", "grid=1024x1x1", "blk=256", "4", "2.0", "10.00", "20.0", "17.2", "0"},
		{"gemv_bf16_1", "grid=512x1x1", "blk=256", "1", "0.5", "30.00", "15.0", "12.9", "0"},
		{"memcpy", "HtoD", "4096B", "1", "0.5", "2.00", "1.0", "0.9", "100"},
		total,
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("%d lines, want %d", len(lines), len(want)+1)
	}
	for i, w := range want {
		if got := strings.Fields(lines[i]); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("line %d: %q, want fields %q", i, lines[i], w)
		}
	}
	if l := lines[len(want)]; !strings.HasPrefix(l, "GPU idle between spans: 4.8 µs, 2.4 µs/step, 0.60 µs a call ") {
		t.Errorf("idle line %q", l)
	}
	if l := (profKey{kind: profGemm, dims: [3]uint32{1, 2, 3}, block: 1}).label(); l != "cublasLt m=1 n=2 k=3 +=" {
		t.Errorf("accumulating GEMM label %q", l)
	}
	tb.reset()
	if len(tb.rows) != 4 || tb.rows[1].calls != 0 || tb.rows[1].us != 0 || tb.rows[2].starved != 0 || tb.steps != 0 || tb.idle != 0 || tb.row(up) != 2 {
		t.Fatalf("after reset: rows %+v, %d steps, %g µs idle; want the rows, no counts", tb.rows, tb.steps, tb.idle)
	}
	// No steps: the per-step columns are blank.
	sb.Reset()
	tb.add(tb.row(up), 1, 0)
	tb.write(&sb)
	if l := strings.Split(sb.String(), "\n")[6]; fmt.Sprint(strings.Fields(l)) != "[memcpy HtoD 4096B 1 - 1.00 - 100.0 0]" {
		t.Errorf("without steps:\n%s", sb.String())
	}
}

// TestProfile runs kernels, GEMMs and copies on a profiling Device
// (FERRITE_CUDA_PROFILE=1) and checks every one is counted under its label
// with a positive time, across a refill of the event pool; then that a
// profiling Backend runs eagerly and counts its steps.
func TestProfile(t *testing.T) {
	needGPU(t)
	t.Setenv("FERRITE_CUDA_PROFILE", "1")
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Profiling() || d.pdl {
		t.Fatalf("profiling %v, PDL %v: want profiling without PDL", d.Profiling(), d.pdl)
	}
	const rows, dim = 5, 100
	rng := rand.New(rand.NewPCG(1, 2))
	x, w, y := upload(t, d, randF32(rng, rows*dim)), upload(t, d, randF32(rng, dim)), poisoned(t, d, rows*dim)
	d.ResetProfile()
	n := profilePairs + 100 // one harvest of a full pool on the way
	for range n {
		if err := d.RMSNorm(y, x, w, rows, dim, 1e-6, false); err != nil {
			t.Fatal(err)
		}
	}
	gemms := 0
	if d.HasGemm() == nil {
		xh, err := d.Alloc(4 * 128 * 2)
		if err != nil {
			t.Fatal(err)
		}
		defer xh.Free()
		m := uploadMat(t, d, kerneltest.NewMat(rng, kernels.BF16, 64, 128, 0, 0))
		if err := d.ToBF16(xh, upload(t, d, randF32(rng, 4*128)), 4*128); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := d.GemmBF16(y, xh, m, 4); err != nil {
				t.Fatal(err)
			}
		}
		gemms = 2
	}
	download(t, y, rows*dim)
	tb, err := d.profileTable()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	tb.write(&sb)
	t.Log("\n" + sb.String())
	want := map[string]int{"rmsnorm_f32 grid=5x1x1 blk=256": n, fmt.Sprintf("memcpy DtoH %dB", 4*rows*dim): 1}
	if gemms > 0 {
		want["cublasLt m=4 n=64 k=128"] = gemms
		want["f32_to_bf16 grid=2x1x1 blk=256"] = 1
	}
	for k, calls := range want {
		i, ok := rowByLabel(tb, k)
		if !ok {
			t.Errorf("no row %q", k)
			continue
		}
		if r := tb.rows[i]; r.calls != calls || !(r.us > 0) || r.us/float64(r.calls) > 1e5 {
			t.Errorf("row %q: %d calls, %.1f µs; want %d calls, 0 < µs/call < 1e5", k, r.calls, r.us, calls)
		}
	}
	if tb.steps != 0 {
		t.Errorf("%d steps counted outside any step", tb.steps)
	}

	b, err := OpenBackend(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.graphs.enabled || !b.Profiling() {
		t.Fatalf("profiling Backend: graphs %v, profiling %v; want eager and profiling", b.graphs.enabled, b.Profiling())
	}
	src, _ := b.Alloc(kernels.F32, 4, 64)
	dst, _ := b.Alloc(kernels.F32, 4, 64)
	in := randF32(rng, 4*64)
	b.WriteF32(src, in)
	b.ResetProfile()
	for range 3 {
		b.BeginStep()
		b.Copy(dst, src)
		b.EndStep()
	}
	got := make([]float32, len(in))
	b.ReadF32(got, dst)
	for i := range in {
		if got[i] != in[i] {
			t.Fatalf("Copy under profiling: element %d = %g, want %g", i, got[i], in[i])
		}
	}
	tb, err = b.dev.profileTable()
	if err != nil || b.Err() != nil {
		t.Fatal(err, b.Err())
	}
	if i, ok := rowByLabel(tb, "copy_rows grid=1x1x1 blk=256"); tb.steps != 3 || !ok || tb.rows[i].calls != 3 {
		sb.Reset()
		tb.write(&sb)
		t.Errorf("3 steps of one Copy: want 3 steps and 3 copy_rows calls, got\n%s", sb.String())
	}
}

// TestProfileGraph runs four steps of one Copy on a Backend profiling in
// graph mode (FERRITE_CUDA_PROFILE=graph): the first runs eagerly untimed,
// the second is captured with event record nodes and launched, the others
// replay it; the three graph launches are timed and counted, the copy
// stays right, and a reset keeps the captured graph's rows valid.
func TestProfileGraph(t *testing.T) {
	needGPU(t)
	t.Setenv("FERRITE_CUDA_PROFILE", "graph")
	t.Setenv("FERRITE_CUDA_GRAPHS", "1")
	b, err := OpenBackend(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Profiling() || !b.dev.prof.graph || !b.graphs.enabled {
		t.Skipf("graph profiling unavailable (cuEventRecordWithFlags %#x, graphs %v)", driver.cuEventRecordWithFlags, b.graphs.enabled)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	src, _ := b.Alloc(kernels.F32, 4, 64)
	dst, _ := b.Alloc(kernels.F32, 4, 64)
	in := randF32(rng, 4*64)
	b.WriteF32(src, in)
	steps := func(n int) {
		for range n {
			b.BeginStep()
			b.Copy(dst, src)
			b.EndStep()
		}
	}
	b.ResetProfile()
	steps(4)
	got := make([]float32, len(in))
	b.ReadF32(got, dst)
	for i := range in {
		if got[i] != in[i] {
			t.Fatalf("Copy in a profiled graph: element %d = %g, want %g", i, got[i], in[i])
		}
	}
	check := func(what string, wantSteps int) {
		t.Helper()
		tb, err := b.dev.profileTable()
		if err != nil || b.Err() != nil {
			t.Fatal(err, b.Err())
		}
		var sb strings.Builder
		tb.write(&sb)
		t.Log("\n" + sb.String())
		i, ok := rowByLabel(tb, "copy_rows grid=1x1x1 blk=256")
		if tb.steps != wantSteps || !ok || tb.rows[i].calls != wantSteps || !(tb.rows[i].us > 0) || tb.rows[i].us/float64(wantSteps) > 1e4 {
			t.Errorf("%s: want %d steps and copy_rows calls, 0 < µs/call < 1e4", what, wantSteps)
		}
	}
	check("4 steps", 3)
	if c, r, err := b.GraphStats(); c != 1 || r != 3 || err != nil {
		t.Errorf("graph stats: %d captures, %d replays, %v; want 1, 3, nil", c, r, err)
	}
	b.ResetProfile()
	steps(2)
	check("2 more replays after a reset", 2)
}

// rowByLabel finds the row of t labelled l.
func rowByLabel(t profTable, l string) (int, bool) {
	for i, r := range t.rows {
		if r.label == l {
			return i, true
		}
	}
	return 0, false
}
