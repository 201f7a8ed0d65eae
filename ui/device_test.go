package ui

import "testing"

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
