//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unsafe"
)

// cudaSources is every source in src/, concatenated.
func cudaSources(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("src/*.cu")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CUDA sources (%v)", err)
	}
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}

// TestPDLKernelsWait checks that every kernel launched with programmatic
// dependent launch starts with FERRITE_PDL_WAIT(), directly or through the
// macro that defines it, after at most a weight prefetch (pdl.go): without
// the wait it could read its inputs before the kernel that writes them has
// finished.
func TestPDLKernelsWait(t *testing.T) {
	src := cudaSources(t)
	const wait = `(?:[\s\\]*(?:(?:split|swiglu)_prefetch<W>\(pf, w, [^;]*\)|attn_prefetch<BF>\(a\));)?[\s\\]*FERRITE_PDL_WAIT\(\);`
	for name := range pdlKernels {
		q := regexp.QuoteMeta(name)
		if regexp.MustCompile(`__global__[^{;]*?\b` + q + `\([^)]*\)\s*\{` + wait).MatchString(src) {
			continue
		}
		m := regexp.MustCompile(`\b(\w+)\(` + q + `,`).FindStringSubmatch(src)
		if m != nil && regexp.MustCompile(`#define `+m[1]+`\([^)]*\)[^{]*\{`+wait).MatchString(src) {
			continue
		}
		// The attention kernels: their macro packs AttnArgs and calls
		// attn_block, which starts with the wait.
		if m != nil && regexp.MustCompile(`#define `+m[1]+`\([^)]*\)[^{]*\{[\s\\]*AttnArgs a\{[^;]*\};[\s\\]*attn_block<`).MatchString(src) &&
			regexp.MustCompile(`__device__ void attn_block\(const AttnArgs& a\)\s*\{`+wait).MatchString(src) {
			continue
		}
		// The one-row decode kernels (ops_decode.cu): before the wait they
		// read only the step's inputs, past keys and values and weights
		// (dec_block's and ferrite_rmsnorm_row's comments say why).
		if m != nil && regexp.MustCompile(`#define `+m[1]+`\([^)]*\)[^{]*\{[\s\\]*DecArgs a\{[^;]*\};[\s\\]*dec_block<`).MatchString(src) &&
			decPreWaitOK(src) {
			continue
		}
		if name == "ferrite_rmsnorm_row" && regexp.MustCompile(`ferrite_rmsnorm_row\([^)]*\)\s*\{[^}]*\}\s*FERRITE_PDL_WAIT\(\);`).MatchString(src) {
			continue
		}
		// ferrite_moe_b1_*: the down half plans and asks for weights
		// before its wait (ids from two launches back, weights never
		// written); every other mode waits first.
		if m != nil && regexp.MustCompile(`#define `+m[1]+`\([^)]*\)[^{]*\{[\s\\]*moe_b1<C, NT>\(`).MatchString(src) &&
			regexp.MustCompile(`__device__ void moe_b1\([^)]*\)\s*\{[^}]*if \(mode == kB1Down\) \{[^}]*FERRITE_PDL_WAIT\(\);\s*\} else \{\s*const MatDesc\* tb = b1_table\([^;]*\);`+wait).MatchString(src) {
			continue
		}
		t.Errorf("%s is launched with PDL but does not start with FERRITE_PDL_WAIT()", name)
	}
}

// TestLaunchConfigLayout checks the Go mirrors of CUlaunchConfig and
// CUlaunchAttribute against the C layout (64-bit).
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttr
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56}, {"hStream", unsafe.Offsetof(c.stream), 32},
		{"attrs", unsafe.Offsetof(c.attrs), 40}, {"numAttrs", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72}, {"value", unsafe.Offsetof(a.val), 8},
	} {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
}

// TestKernelNames checks, without a GPU, that every kernel name the Go
// side launches ("ferrite_…" literals outside tests) is one loadModule
// resolves, and that every resolved name is a kernel in src/: a missing
// one would only fail on the GPU.
func TestKernelNames(t *testing.T) {
	resolved := map[string]bool{}
	for _, n := range kernelNames {
		resolved[n] = true
	}
	gofiles, _ := filepath.Glob("*.go")
	lit := regexp.MustCompile(`"(ferrite_\w+)"`)
	for _, f := range gofiles {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			if !resolved[m[1]] {
				t.Errorf("%s: %s is launched but not in kernelNames", f, m[1])
			}
		}
	}
	src := cudaSources(t)
	for n := range resolved {
		q := regexp.QuoteMeta(n)
		if !regexp.MustCompile(`(__global__[^{;]*?\b` + q + `\()|(\(` + q + `,)`).MatchString(src) {
			t.Errorf("kernelNames lists %s, which src/ does not define", n)
		}
	}
}

// decPreWaitOK reports whether dec_block (src/ops_decode.cu) waits at all,
// and before its wait reads only what it may: it starts its tile copies
// (dec_load) and touches none of the kernel before's outputs or its own
// (out, part, cnt, q, qkv, slot, the cache stores).
func decPreWaitOK(src string) bool {
	i := strings.Index(src, "__device__ void dec_block(const DecArgs& a)")
	if i < 0 {
		return false
	}
	j := strings.Index(src[i:], "FERRITE_PDL_WAIT();")
	if j < 0 {
		return false
	}
	pre := src[i : i+j]
	if !strings.Contains(pre, "dec_load<HD, BF>(") {
		return false
	}
	return !regexp.MustCompile(`\ba\.(out|part|cnt|q|qkv|slot)\b|head_put|atomic`).MatchString(pre)
}
