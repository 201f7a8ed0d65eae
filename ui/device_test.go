package ui

import (
	"strings"
	"testing"

	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestDeviceInStatusBarAndStats checks that the device running the model
// shows in the status bar (short) and in /stats (whole, with auto's note).
func TestDeviceInStatusBarAndStats(t *testing.T) {
	eng := newFakeEngine()
	eng.info.Device = "cpu (16 threads)"
	eng.info.DeviceNote = "no GPU: libcuda.so.1: cannot open shared object file"
	h := start(t, eng, testOptions(t))
	h.waitFor("Fake-1B fake │ cpu │")
	h.line("/stats")
	h.untilNotice("Device: cpu (16 threads) (no GPU: libcuda.so.1: cannot open shared object file)\n")
	h.final()

	for desc, want := range map[string]string{
		"cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139 GiB)": "cuda:0 NVIDIA H200",
		"cpu (2 threads)": "cpu",
		"cpu":             "cpu",
	} {
		if got := deviceShort(desc); got != want {
			t.Errorf("deviceShort(%q) = %q, want %q", desc, got, want)
		}
	}
}

// gpuMemoryUse is a fake GPU backend's report: 16 GiB of weights, a 2 GiB
// KV cache (the fake engine's stats say 12 MiB: the rest counts as other
// tensors), a 512 MiB arena, on a 139.8 GiB device.
var gpuMemoryUse = kernels.MemoryUse{OnDevice: true, Weights: 16 << 30, Tensors: 2 << 30, Arena: 512 << 20,
	Total: 150_000_000_000, Free: 120 << 30}

// TestGPUMemoryInStatusBarAndStats checks the device memory a GPU reports:
// used over total in the status bar, every part in /stats.
func TestGPUMemoryInStatusBarAndStats(t *testing.T) {
	eng := newFakeEngine()
	eng.info.Device = "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139 GiB)"
	eng.stats.Memory = gpuMemoryUse
	h := start(t, eng, testOptions(t))
	h.waitFor("Fake-1B fake │ GPU 18.5/140 GiB │") // the device name does not fit 80 columns
	h.line("/stats")
	h.untilNotice("Memory (GPU): weights 16.0 GiB, KV cache 12.0 MiB, other tensors 2.0 GiB, step arena 512.0 MiB; " +
		"18.5 GiB in all; the device has 139.7 GiB, 120.0 GiB free\n")
	h.final()
	st := NewStyles(DefaultPalette(), true, false)
	if bar := xansi.Strip(statusBar{st: &st}.render(120, statusData{info: eng.info, stats: eng.stats})); !strings.Contains(bar, "│ cuda:0 NVIDIA H200 │ GPU 18.5/140 GiB │") {
		t.Errorf("wide status bar lacks the device and its memory: %q", bar)
	}

	for u, want := range map[kernels.MemoryUse]string{
		{OnDevice: true, Weights: 1 << 29, Total: 24 << 30}: "0.5/24.0 GiB",
		{OnDevice: true, Weights: 17 << 30, Arena: 1 << 29}: "17.5 GiB", // the driver gave no total
	} {
		if got := gpuMemory(u); got != want {
			t.Errorf("gpuMemory(%+v) = %q, want %q", u, got, want)
		}
	}
}

// TestHostMemoryInStats checks the CPU: /stats shows the weights and the
// KV cache in host RAM, the status bar stays as it was.
func TestHostMemoryInStats(t *testing.T) {
	eng := newFakeEngine()
	eng.info.Device = "cpu (16 threads)"
	eng.stats.Memory = kernels.MemoryUse{Weights: 30 << 20, Tensors: 12 << 20, Arena: 3 << 20}
	st := NewStyles(DefaultPalette(), true, false)
	bar := xansi.Strip(statusBar{st: &st}.render(200, statusData{info: eng.info, stats: eng.stats}))
	if strings.Contains(bar, "GPU") || !strings.Contains(bar, "Fake-1B fake │ cpu │ KV") || lipgloss.Width(bar) != 200 {
		t.Errorf("CPU status bar: %q", bar)
	}
	h := start(t, eng, testOptions(t))
	h.line("/stats")
	h.untilNotice("Memory (host RAM): weights 30.0 MiB, KV cache 12.0 MiB, step arena 3.0 MiB; 45.0 MiB in all\n")
	h.final()
}
