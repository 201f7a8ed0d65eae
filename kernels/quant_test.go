package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var quantTypes = []DType{Q8_0, Q4_0, Q4K, Q5K, Q6K}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "quant", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func floatsLE(b []byte) []float32 {
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f
}

// TestDequantMatchesGGUFPy checks RowF32 against llama.cpp's gguf-py
// dequantizers on random blocks (tools/quantfixtures/make.py), bit for bit.
// The blocks are read as a 4-row matrix so that row offsets count too.
func TestDequantMatchesGGUFPy(t *testing.T) {
	for _, dt := range quantTypes {
		t.Run(dt.String(), func(t *testing.T) {
			blocks := readFixture(t, dt.String()+".blocks")
			want := floatsLE(readFixture(t, dt.String()+".f32"))
			nb := len(blocks) / dt.BlockBytes()
			if nb*dt.BlockElems() != len(want) || nb%4 != 0 {
				t.Fatalf("fixture sizes: %d blocks, %d values", nb, len(want))
			}
			m := &Mat{DType: dt, Rows: 4, Cols: nb / 4 * dt.BlockElems(), Data: blocks}
			got := make([]float32, m.Cols)
			bad := 0
			for r := range m.Rows {
				m.RowF32(got, r)
				for i, v := range got {
					w := want[r*m.Cols+i]
					if math.Float32bits(v) != math.Float32bits(w) {
						if bad++; bad <= 5 {
							t.Errorf("row %d, element %d: got %g (%#08x), want %g (%#08x)",
								r, i, v, math.Float32bits(v), w, math.Float32bits(w))
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d values differ", bad, len(want))
			}
		})
	}
}

// TestQuantizeMatchesGGUFPy checks QuantizeRow for the types whose gguf-py
// quantizers are bit-exact with ggml's reference quantizers.
func TestQuantizeMatchesGGUFPy(t *testing.T) {
	for _, dt := range []DType{Q8_0, Q4_0} {
		t.Run(dt.String(), func(t *testing.T) {
			x := floatsLE(readFixture(t, dt.String()+".in.f32"))
			want := readFixture(t, dt.String()+".quant")
			got := make([]byte, dt.RowBytes(len(x)))
			QuantizeRow(dt, got, x)
			if len(got) != len(want) {
				t.Fatalf("%d bytes, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					b := i / dt.BlockBytes()
					t.Fatalf("block %d byte %d: got %#02x, want %#02x (block % x, want % x)", b, i%dt.BlockBytes(),
						got[i], want[i], got[b*dt.BlockBytes():(b+1)*dt.BlockBytes()], want[b*dt.BlockBytes():(b+1)*dt.BlockBytes()])
				}
			}
		})
	}
}

// TestQuantizeRoundTrip bounds the error of quantize → dequantize on
// Gaussian rows, relative to the rows' RMS, per type; a wrong bit position
// or scale in any quantizer/dequantizer pair breaks it by orders of
// magnitude. It also checks that a zero row stays zero.
func TestQuantizeRoundTrip(t *testing.T) {
	maxRel := map[DType]float64{Q8_0: 0.006, Q4_0: 0.12, Q4K: 0.085, Q5K: 0.042, Q6K: 0.025}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range quantTypes {
		t.Run(dt.String(), func(t *testing.T) {
			src := &Mat{DType: F32, Rows: 8, Cols: 1024, Data: make([]byte, 8*1024*4)}
			for i := range src.Rows * src.Cols {
				v := float32(rng.NormFloat64())
				if i/src.Cols == 3 {
					v *= 1e-3 // a row of small values
				}
				if i/src.Cols == 5 {
					v = 0
				}
				binary.LittleEndian.PutUint32(src.Data[4*i:], math.Float32bits(v))
			}
			q, err := Quantize(src, dt)
			if err != nil {
				t.Fatal(err)
			}
			want, got := make([]float32, src.Cols), make([]float32, src.Cols)
			for r := range src.Rows {
				src.RowF32(want, r)
				q.RowF32(got, r)
				var e2, s2 float64
				for i := range want {
					d := float64(got[i] - want[i])
					e2 += d * d
					s2 += float64(want[i]) * float64(want[i])
				}
				if s2 == 0 {
					if e2 != 0 {
						t.Errorf("row %d: zero row dequantizes to nonzero values", r)
					}
					continue
				}
				if rel := math.Sqrt(e2 / s2); !(rel <= maxRel[dt]) {
					t.Errorf("row %d: relative RMS error %.4f, want ≤ %.4f", r, rel, maxRel[dt])
				}
			}
		})
	}
}

func TestRowF32PartialBlockPanics(t *testing.T) {
	defer func() {
		if r, _ := recover().(string); r != "kernels: RowF32 quantized row not a whole number of blocks" {
			t.Errorf("recovered %q", r)
		}
	}()
	m := &Mat{DType: Q8_0, Rows: 1, Cols: 48, Data: make([]byte, 68)}
	m.RowF32(make([]float32, 48), 0)
}

func TestQuantizeErrors(t *testing.T) {
	m := &Mat{DType: F32, Rows: 2, Cols: 48, Data: make([]byte, 2*48*4)}
	if _, err := Quantize(m, Q4K); err == nil {
		t.Error("48 columns quantized to Q4_K (256-element blocks)")
	}
	if _, err := Quantize(m, BF16); err == nil {
		t.Error("BF16 accepted as a quantized type")
	}
	if _, err := Quantize(m, Q8_0); err == nil {
		// 48 is not a multiple of 32 either.
		t.Error("48 columns quantized to Q8_0 (32-element blocks)")
	}
}

// TestF32ToF16 checks the rounding against every float16: each value
// converts to itself, the midpoint between neighbours rounds to the even
// one, and anything past the midpoint rounds up.
func TestF32ToF16(t *testing.T) {
	for h := range uint32(0x7c00) { // every finite non-negative float16
		for _, sign := range []uint16{0, 0x8000} {
			hs := uint16(h) | sign
			a := F16ToF32(hs)
			if got := F32ToF16(a); got != hs && a != 0 {
				t.Fatalf("F32ToF16(%g) = %#04x, want %#04x", a, got, hs)
			}
		}
		if h == 0x7bff {
			break
		}
		a, b := F16ToF32(uint16(h)), F16ToF32(uint16(h+1))
		mid := (a + b) / 2 // exact: float32 has 13 more mantissa bits
		even := uint16(h)
		if h&1 == 1 {
			even = uint16(h + 1)
		}
		if got := F32ToF16(mid); got != even {
			t.Fatalf("F32ToF16(%g) (midpoint of %#04x and %#04x) = %#04x, want %#04x", mid, h, h+1, got, even)
		}
		if got := F32ToF16(math.Nextafter32(mid, 1e9)); got != uint16(h+1) {
			t.Fatalf("just above the midpoint of %#04x: got %#04x", h, got)
		}
		if got := F32ToF16(math.Nextafter32(mid, 0)); got != uint16(h) {
			t.Fatalf("just below the midpoint of %#04x: got %#04x", h, got)
		}
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{0x1p-25, 0}, {0x1.000002p-25, 1}, {-0x1p-26, 0x8000},
	} {
		if got := F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := F32ToF16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("F32ToF16(NaN) = %#04x, not a NaN", got)
	}
}
