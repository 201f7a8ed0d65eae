package cpuinfo

import "testing"

func TestDisableRestores(t *testing.T) {
	was := AVX2FMA()
	restore := DisableAVX2FMA()
	if AVX2FMA() {
		t.Fatal("AVX2FMA still on after DisableAVX2FMA")
	}
	restore()
	if AVX2FMA() != was {
		t.Fatal("restore did not bring AVX2FMA back")
	}
	was = F16C()
	restore = DisableF16C()
	if F16C() {
		t.Fatal("F16C still on after DisableF16C")
	}
	restore()
	if F16C() != was {
		t.Fatal("restore did not bring F16C back")
	}
}
