package units

import (
	"testing"
	"time"
)

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB", 3 << 40: "3.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 1499 * time.Millisecond: "1s", 59 * time.Second: "59s", 185 * time.Second: "3m05s", 3720 * time.Second: "1h02m",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestHomePaths(t *testing.T) {
	t.Setenv("HOME", "/home/ann")
	for in, want := range map[string]string{"~/models/x": "/home/ann/models/x", "~x/y": "~x/y", "/tmp/~/z": "/tmp/~/z", "~": "~"} {
		if got := ExpandHome(in); got != want {
			t.Errorf("ExpandHome(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"/home/ann/models/x": "~/models/x", "/home/annex/y": "/home/annex/y", "/home/ann": "/home/ann", "/srv/m": "/srv/m"} {
		if got := ShortPath(in); got != want {
			t.Errorf("ShortPath(%q) = %q, want %q", in, got, want)
		}
	}
}
