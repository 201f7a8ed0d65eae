package engine

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/device"
)

// matMulOnly is a backend with MatMul and Parallel but not the op set: a
// GPU backend that has not ported the op set (the CUDA backend has; see
// TestCUDABackendHasOpSet in kernels/device).
type matMulOnly struct{ kernels.Backend }

func (matMulOnly) Name() string { return "fake-gpu" }

// fakeGPU makes every device but the CPU open as gpu ("fake-gpu:0") for
// the rest of t.
func fakeGPU(t *testing.T, gpu kernels.Backend) {
	orig := openDevice
	t.Cleanup(func() { openDevice = orig })
	openDevice = func(s device.Spec, threads int) (*device.Backend, error) {
		if s.Kind == device.CPU {
			return orig(s, threads)
		}
		return &device.Backend{Backend: gpu, Desc: "fake-gpu:0"}, nil
	}
}

// TestAutoDeviceFallsBackToCPU: when --device auto opens a GPU backend
// that lacks the op set, an architecture on the op set loads on the CPU
// (and says why) instead of failing; an explicit device still fails.
func TestAutoDeviceFallsBackToCPU(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	fakeGPU(t, matMulOnly{c})

	l, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto"})
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer l.Close()
	if _, ok := l.Backend.(kernels.Device); !ok {
		t.Errorf("auto: the model runs on %s, not a backend with the op set", l.Backend.Name())
	}
	if !strings.HasPrefix(l.Device, "cpu") || !strings.Contains(l.DeviceNote, "fake-gpu:0 does not run qwen3") {
		t.Errorf("auto: device %q, note %q; want the CPU and why", l.Device, l.DeviceNote)
	}

	if l, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "cuda"}); err == nil {
		l.Close()
		t.Error("an explicit cuda device without the op set loaded the model")
	}
}

// deviceOnly is a backend with the op set's Device but none of its
// optional capabilities (kernels.MLAOps, kernels.SparseOps).
type deviceOnly struct{ kernels.Device }

func (deviceOnly) Name() string { return "fake-gpu" }

// TestAutoDeviceFallsBackForMLA: an MLA architecture needs the MLA and DSA
// capabilities; under --device auto a device without them gives way to the
// CPU, while a GQA model stays on it.
func TestAutoDeviceFallsBackForMLA(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	fakeGPU(t, deviceOnly{c})
	l, err := Load(fixtures.Dir("glm4_moe_lite"), Options{Threads: 1, Device: "auto"})
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer l.Close()
	if !strings.HasPrefix(l.Device, "cpu") || !strings.Contains(l.DeviceNote, "fake-gpu:0 does not run glm4_moe_lite yet (it lacks the op set's MLA") {
		t.Errorf("auto: device %q, note %q; want the CPU and why", l.Device, l.DeviceNote)
	}
	g, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto"})
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer g.Close()
	if g.Device != "fake-gpu:0" || g.DeviceNote != "" {
		t.Errorf("qwen3: device %q, note %q; want the fake GPU", g.Device, g.DeviceNote)
	}
}

// TestAutoDeviceKeepsHybrids: on the device FERRITE_TEST_DEVICE names (the
// GPU machine's cuda), --device auto keeps every op-set architecture with
// recurrent state or glm5_next's ops on the device: the device has their
// capabilities, so no fallback note appears.
func TestAutoDeviceKeepsHybrids(t *testing.T) {
	if spec := os.Getenv("FERRITE_TEST_DEVICE"); spec == "" || strings.HasPrefix(spec, "cpu") {
		t.Skip("FERRITE_TEST_DEVICE names no GPU to keep the models on")
	}
	for _, name := range []string{"qwen3_next", "glm5_next"} {
		t.Run(name, func(t *testing.T) {
			l, err := Load(fixtures.Dir(name), Options{Threads: 1, Device: "auto"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			t.Logf("device %q, note %q", l.Device, l.DeviceNote)
			if strings.HasPrefix(l.Device, "cpu") || l.DeviceNote != "" {
				t.Errorf("%s: device %q, note %q; want the GPU and no fallback", name, l.Device, l.DeviceNote)
			}
		})
	}
}

// memGPU is a device with the op set that reports free device memory.
type memGPU struct {
	kernels.Device
	free int64
}

func (memGPU) Name() string { return "fake-gpu" }

func (g memGPU) MemoryUse() kernels.MemoryUse {
	return kernels.MemoryUse{OnDevice: true, Total: 2*g.free + 1, Free: g.free}
}

// TestDeviceMemoryFit: a model whose weights, with deviceReserve to
// spare, exceed the device's free memory loads on the CPU under --device
// auto, saying why with the numbers, and fails to load on an explicit
// device, or under auto with KeepDevice, with a DeviceMemoryError; with
// room it stays on the device.
func TestDeviceMemoryFit(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	fakeGPU(t, memGPU{c, deviceReserve}) // the reserve and nothing for the weights
	l, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto"})
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer l.Close()
	if !strings.HasPrefix(l.Device, "cpu") || !strings.Contains(l.DeviceNote, "fake-gpu:0 has 0.5 GiB free") ||
		!strings.Contains(l.DeviceNote, "the weights take") {
		t.Errorf("auto: device %q, note %q; want the CPU and why", l.Device, l.DeviceNote)
	}
	var dme *DeviceMemoryError
	if _, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "cuda"}); err == nil ||
		!strings.Contains(err.Error(), "GiB free: run it on the CPU (--device cpu)") || !errors.As(err, &dme) {
		t.Errorf("explicit device without room: %v, want the numbers and the way out", err)
	}
	// KeepDevice: auto fails too, with the numbers, for a caller that can
	// make room.
	_, err = Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto", KeepDevice: true})
	if !errors.As(err, &dme) || dme.Device != "fake-gpu:0" || dme.Free != deviceReserve || dme.Need <= 0 {
		t.Errorf("auto, KeepDevice, without room: %v (%+v), want a DeviceMemoryError", err, dme)
	}

	fakeGPU(t, memGPU{c, 64 << 30})
	g, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto"})
	if err != nil {
		t.Fatalf("auto with room: %v", err)
	}
	defer g.Close()
	if g.Device != "fake-gpu:0" || g.DeviceNote != "" {
		t.Errorf("auto with room: device %q, note %q; want the fake GPU", g.Device, g.DeviceNote)
	}
	k, err := Load(fixtures.Dir("qwen3"), Options{Threads: 1, Device: "auto", KeepDevice: true})
	if err != nil {
		t.Fatalf("auto, KeepDevice, with room: %v", err)
	}
	k.Close()
}
