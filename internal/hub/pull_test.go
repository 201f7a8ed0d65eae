package hub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/hub/hubtest"
)

// client is a Client of the fake hub with its own cache, retrying at once.
func client(t *testing.T, f *hubtest.Hub) *Client {
	return &Client{Endpoint: f.URL, CacheDir: t.TempDir(), retryBase: 1}
}

const (
	commitA = "0123456789abcdef0123456789abcdef01234567"
	commitB = "89abcdef0123456789abcdef0123456789abcdef"
)

// shardedModel is a sharded safetensors repository with files a pull
// must leave alone: a consolidated copy of the weights, a subfolder, a
// README and PyTorch weights.
func shardedModel() map[string]string {
	return map[string]string{
		"config.json":                       `{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}`,
		"generation_config.json":            `{"temperature": 0.6}`,
		"tokenizer.json":                    `{"model": {}}`,
		"tokenizer_config.json":             `{"chat_template": "{{ messages }}"}`,
		indexFile:                           `{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}`,
		"model-00001-of-00002.safetensors":  strings.Repeat("A", 300_000),
		"model-00002-of-00002.safetensors":  strings.Repeat("B", 200_000),
		"consolidated.safetensors":          strings.Repeat("C", 500_000),
		"original/consolidated.safetensors": "nope",
		"README.md":                         "# a model",
		"pytorch_model.bin":                 "pickle",
	}
}

func pullOK(t *testing.T, c *Client, ref string) Result {
	t.Helper()
	r, err := ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Pull(context.Background(), r, nil)
	if err != nil {
		t.Fatalf("Pull(%s): %v", ref, err)
	}
	return res
}

func TestPullLayoutReadByCatalog(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	var reports []Progress
	ref, _ := ParseRef("acme/Tiny-1B")
	res, err := c.Pull(context.Background(), ref, func(p Progress) { reports = append(reports, p) })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"config.json", "generation_config.json", indexFile, "tokenizer.json", "tokenizer_config.json",
		"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
	got := slices.Clone(res.Files)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
	repoDir := filepath.Join(c.CacheDir, "models--acme--Tiny-1B")
	if res.Commit != commitA || res.Dir != filepath.Join(repoDir, "snapshots", commitA) {
		t.Fatalf("result %+v", res)
	}
	if ref, _ := os.ReadFile(filepath.Join(repoDir, "refs", "main")); string(ref) != commitA {
		t.Fatalf("refs/main = %q", ref)
	}
	files := shardedModel()
	for _, name := range want {
		link := filepath.Join(res.Dir, name)
		target, err := os.Readlink(link)
		if err != nil {
			t.Fatalf("%s is not a link: %v", name, err)
		}
		if !strings.HasPrefix(target, "../../blobs/") {
			t.Errorf("%s links to %s, want a relative link into blobs", name, target)
		}
		data, err := os.ReadFile(link)
		if err != nil || string(data) != files[name] {
			t.Errorf("%s: read %d bytes (%v), want its contents", name, len(data), err)
		}
		etag := filepath.Base(target)
		if wantEtag := hubtest.GitSHA1([]byte(files[name])); strings.HasSuffix(name, ".safetensors") {
			wantEtag = hubtest.SHA256([]byte(files[name]))
			if etag != wantEtag {
				t.Errorf("%s: blob %s, want its sha256 %s", name, etag, wantEtag)
			}
		} else if etag != wantEtag {
			t.Errorf("%s: blob %s, want its git sha1 %s", name, etag, wantEtag)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(repoDir, "blobs", "*.incomplete")); len(leftovers) > 0 {
		t.Errorf("left behind: %v", leftovers)
	}
	if res.Size != 500_000+int64(len(files["config.json"])+len(files["generation_config.json"])+len(files[indexFile])+
		len(files["tokenizer.json"])+len(files["tokenizer_config.json"])) || res.Downloaded != res.Size {
		t.Errorf("size %d, downloaded %d", res.Size, res.Downloaded)
	}
	last := reports[len(reports)-1]
	if last.Stage != "done" || last.Done != last.Total || last.Total != res.Size || last.Files != len(want) {
		t.Errorf("last progress %+v", last)
	}
	var prev int64
	for _, p := range reports {
		if p.Total > 0 && p.Done < prev {
			t.Errorf("progress went back to %d after %d: %+v", p.Done, prev, p)
		}
		if p.Total > 0 {
			prev = p.Done
		}
	}

	// internal/catalog finds it at once, under its Hub name.
	es, errs := catalog.Discover(catalog.Options{HubDir: c.CacheDir, FerriteDir: t.TempDir()})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	e, err := catalog.Find(es, "acme/Tiny-1B")
	if err != nil {
		t.Fatal(err)
	}
	if e.Dir != res.Dir || e.Arch != "qwen3" || e.Problem != "" || e.Source != catalog.SourceHFCache {
		t.Fatalf("catalog entry %+v", e)
	}

	// A second pull finds everything in the cache.
	_, gets := f.Count()
	again := pullOK(t, c, "acme/Tiny-1B")
	if _, gets2 := f.Count(); gets2 != gets || again.Downloaded != 0 || again.Dir != res.Dir {
		t.Fatalf("second pull fetched %d more files, downloaded %d", gets2-gets, again.Downloaded)
	}
}

func TestPullSharesBlobsBetweenRevisions(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	pullOK(t, c, "acme/Tiny-1B")
	// A new commit that changes only the generation config.
	files := shardedModel()
	files["generation_config.json"] = `{"temperature": 0.7}`
	f.Add("acme/Tiny-1B", commitB, files)
	requests, gets := f.Count()
	res := pullOK(t, c, "acme/Tiny-1B")
	requests2, gets2 := f.Count()
	// The listing, and one HEAD and one GET for the changed file.
	if res.Commit != commitB || requests2-requests != 3 || gets2 != gets || res.Downloaded != int64(len(files["generation_config.json"])) {
		t.Fatalf("commit %s: %d Hub requests, %d CDN GETs, %d bytes downloaded", res.Commit, requests2-requests, gets2-gets, res.Downloaded)
	}
	if data, _ := os.ReadFile(filepath.Join(res.Dir, "generation_config.json")); string(data) != files["generation_config.json"] {
		t.Fatalf("generation_config.json = %q", data)
	}
	if ref, _ := os.ReadFile(filepath.Join(c.CacheDir, "models--acme--Tiny-1B", "refs", "main")); string(ref) != commitB {
		t.Fatalf("refs/main = %q", ref)
	}
}

func TestPullDownloadsFilesInParallel(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	f.Throttle(2 << 20) // 0.1 s per 200 KiB: the shards overlap
	res := pullOK(t, client(t, f), "acme/Tiny-1B")
	// The fake counts a GET until its handler returns, which can be just
	// after the client has read the last byte and started its next file:
	// one more than parallelFiles is that overlap, not a fifth download
	// (the model has 7 files, so pulling them all at once still fails).
	if n := f.MostAtOnce(); n < 2 || n > parallelFiles+1 {
		t.Fatalf("%d files downloaded at once, want 2 to %d", n, parallelFiles)
	}
	if res.Downloaded != res.Size {
		t.Fatalf("downloaded %d of %d", res.Downloaded, res.Size)
	}
}

func TestPullTokenGoesOnlyToTheHub(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	c.Token = "hf_secret"
	pullOK(t, c, "acme/Tiny-1B")
	if f.Auth("hub") != "Bearer hf_secret" || f.Auth("cdn") != "" {
		t.Fatalf("Authorization: hub %q, CDN %q", f.Auth("hub"), f.Auth("cdn"))
	}
}

func TestPullRevisionAndRenamedRepository(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/New", commitB, shardedModel())
	f.Rename("acme/Old", "acme/New")
	c := client(t, f)
	res := pullOK(t, c, "acme/Old@"+commitB)
	if res.Commit != commitB || !strings.Contains(res.Dir, "models--acme--Old") {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(c.CacheDir, "models--acme--Old", "refs")); !os.IsNotExist(err) {
		t.Errorf("a commit hash should write no ref (%v)", err)
	}
	if _, err := os.ReadFile(filepath.Join(res.Dir, "model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
}

func TestPullResumesACutTransfer(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	f.CutOnce("model-00001-of-00002.safetensors", 120_000)
	f.CutOnce("tokenizer.json", 3) // a small file, straight from the Hub
	c := client(t, f)
	res := pullOK(t, c, "acme/Tiny-1B")
	ranges := f.Ranges()
	if !slices.Contains(ranges, "model-00001-of-00002.safetensors=bytes=120000-") || !slices.Contains(ranges, "tokenizer.json=bytes=3-") {
		t.Fatalf("ranges %v, want the cut files resumed where they stopped", ranges)
	}
	data, _ := os.ReadFile(filepath.Join(res.Dir, "model-00001-of-00002.safetensors"))
	if string(data) != shardedModel()["model-00001-of-00002.safetensors"] {
		t.Fatal("the resumed file differs")
	}
}

func TestPullResumesAcrossRuns(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	clock := time.Unix(0, 0)
	c.now = func() time.Time { clock = clock.Add(time.Second); return clock } // every read reports
	shard := "model-00001-of-00002.safetensors"
	f.StallOnce(shard, 150_000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sawSpeed bool
	ref, _ := ParseRef("acme/Tiny-1B")
	_, err := c.Pull(ctx, ref, func(p Progress) {
		sawSpeed = sawSpeed || (p.Speed > 0 && p.ETA > 0)
		if p.File == shard && p.FileDone >= 100_000 {
			cancel() // the user pressed Ctrl+C
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want cancelled", err)
	}
	if !sawSpeed {
		t.Error("no progress report had a speed and an ETA")
	}
	inc := filepath.Join(c.CacheDir, "models--acme--Tiny-1B", "blobs", hubtest.SHA256([]byte(shardedModel()[shard]))+".incomplete")
	st, err := os.Stat(inc)
	if err != nil {
		t.Fatalf("no partial download of %s: %v", shard, err)
	}
	part := st.Size()
	if part < 100_000 || part >= 300_000 {
		t.Fatalf("partial file of %d bytes", part)
	}

	c.now = nil
	res := pullOK(t, c, "acme/Tiny-1B")
	if !slices.Contains(f.Ranges(), shard+"=bytes="+strconv.FormatInt(part, 10)+"-") {
		t.Fatalf("ranges %v, want %s resumed at %d", f.Ranges(), shard, part)
	}
	if res.Downloaded > res.Size-part {
		t.Errorf("downloaded %d of %d: the partial %d bytes were fetched again", res.Downloaded, res.Size, part)
	}
	data, _ := os.ReadFile(filepath.Join(res.Dir, shard))
	if string(data) != shardedModel()[shard] {
		t.Fatal("the resumed file differs")
	}
}

func TestPullRetriesAStalledTransfer(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	shard := "model-00002-of-00002.safetensors"
	f.StallOnce(shard, 50_000)
	c := client(t, f)
	c.Stall = 200 * time.Millisecond
	res := pullOK(t, c, "acme/Tiny-1B")
	if !slices.Contains(f.Ranges(), shard+"=bytes=50000-") {
		t.Fatalf("ranges %v, want the stalled file resumed", f.Ranges())
	}
	if data, _ := os.ReadFile(filepath.Join(res.Dir, shard)); string(data) != shardedModel()[shard] {
		t.Fatal("the resumed file differs")
	}
}

func TestPullRejectsACorruptFile(t *testing.T) {
	for _, name := range []string{"model-00002-of-00002.safetensors", "config.json"} { // sha256, git sha1
		t.Run(name, func(t *testing.T) {
			f := hubtest.New(t)
			f.Add("acme/Tiny-1B", commitA, shardedModel())
			f.Corrupt(name, true)
			c := client(t, f)
			ref, _ := ParseRef("acme/Tiny-1B")
			_, err := c.Pull(context.Background(), ref, nil)
			if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), name) {
				t.Fatalf("err %v, want a checksum error naming %s", err, name)
			}
			data := []byte(shardedModel()[name])
			etag := hubtest.GitSHA1(data)
			if strings.HasSuffix(name, ".safetensors") {
				etag = hubtest.SHA256(data)
			}
			blob := filepath.Join(c.CacheDir, "models--acme--Tiny-1B", "blobs", etag)
			for _, p := range []string{blob, blob + ".incomplete"} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("the corrupt download was kept: %s", p)
				}
			}
			if _, err := os.Lstat(filepath.Join(c.CacheDir, "models--acme--Tiny-1B", "snapshots", commitA, name)); err == nil {
				t.Error("the corrupt file was linked into the snapshot")
			}
			// Served right again, the pull completes.
			f.Corrupt(name, false)
			pullOK(t, c, "acme/Tiny-1B")
		})
	}
}

func TestPullErrors(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	gated := f.Add("meta/Gated-8B", commitB, shardedModel())
	gated.Gated = true
	f.Token = "hf_good"
	f.Add("acme/Bin-Only", commitA, map[string]string{"config.json": "{}", "pytorch_model.bin": "x"})
	for _, tc := range []struct {
		ref, token string
		want       error
		says       string
	}{
		{"acme/Missing", "", ErrNotFound, "or it is private (set HF_TOKEN)"},
		{"acme/Missing", "hf_good", ErrNotFound, "no such model repository"},
		{"acme/Tiny-1B@nope", "", ErrNotFound, `no revision "nope"`},
		{"meta/Gated-8B", "", ErrAuth, "set HF_TOKEN"},
		{"meta/Gated-8B", "hf_other", ErrAuth, "this token has no access"},
		{"acme/Bin-Only", "", ErrNoModel, "pytorch_model.bin"},
		{"acme/Tiny-1B:Q4_K_M", "", ErrNoModel, "no .gguf files"},
	} {
		c := client(t, f)
		c.Token = tc.token
		ref, err := ParseRef(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Pull(context.Background(), ref, nil)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s (token %q): %v; want %v saying %q", tc.ref, tc.token, err, tc.want, tc.says)
		}
	}
	c := client(t, f)
	c.Token = "hf_good"
	pullOK(t, c, "meta/Gated-8B")
}

func TestPullOffline(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	online := pullOK(t, c, "acme/Tiny-1B")
	before, _ := f.Count()
	c.Offline = true
	res := pullOK(t, c, "acme/Tiny-1B")
	if after, _ := f.Count(); after != before {
		t.Fatalf("offline pull made %d requests", after-before)
	}
	if !res.Offline || res.Dir != online.Dir || res.Size != online.Size {
		t.Fatalf("offline %+v, online %+v", res, online)
	}
	ref, _ := ParseRef("acme/Other")
	if _, err := c.Pull(context.Background(), ref, nil); !errors.Is(err, ErrOffline) {
		t.Fatalf("err %v, want ErrOffline", err)
	}
}

func TestPullChecksDiskSpaceFirst(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	c.freeSpace = func(string) (int64, error) { return 1000, nil }
	ref, _ := ParseRef("acme/Tiny-1B")
	_, err := c.Pull(context.Background(), ref, nil)
	if !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), "1000 B free") {
		t.Fatalf("err %v, want a disk-space error", err)
	}
	if _, gets := f.Count(); gets != 0 {
		t.Fatalf("%d weight downloads started", gets)
	}
}

func TestPullWaitsForTheLock(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-1B", commitA, shardedModel())
	c := client(t, f)
	lockDir := filepath.Join(c.CacheDir, ".locks", "models--acme--Tiny-1B")
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	held, busy, err := tryLock(filepath.Join(lockDir, hubtest.SHA256([]byte(shardedModel()["model-00002-of-00002.safetensors"]))+".lock"))
	if err != nil || busy {
		t.Fatal(err, busy)
	}
	waiting := make(chan struct{})
	done := make(chan error, 1)
	ref, _ := ParseRef("acme/Tiny-1B")
	go func() {
		var once bool
		_, err := c.Pull(context.Background(), ref, func(p Progress) {
			if strings.HasPrefix(p.Stage, "waiting for another pull") && !once {
				once = true
				close(waiting)
			}
		})
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the pull ended (%v) without waiting for the lock", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the pull never waited for the lock")
	}
	held.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPullGGUF(t *testing.T) {
	f := hubtest.New(t)
	f.Add("acme/Tiny-GGUF", commitA, map[string]string{
		"Tiny-Q4_K_M-00001-of-00002.gguf": "part one",
		"Tiny-Q4_K_M-00002-of-00002.gguf": "part two",
		"Tiny-Q4_K.gguf":                  "q4k",
		"Tiny-Q8_0.gguf":                  "q8",
		"mmproj-Tiny-Q8_0.gguf":           "vision",
		"README.md":                       "# gguf",
	})
	c := client(t, f)
	res := pullOK(t, c, "acme/Tiny-GGUF:q4_k_m")
	if !res.GGUF || !slices.Equal(res.Files, []string{"Tiny-Q4_K_M-00001-of-00002.gguf", "Tiny-Q4_K_M-00002-of-00002.gguf"}) {
		t.Fatalf("result %+v", res)
	}
	if res := pullOK(t, c, "acme/Tiny-GGUF:Q4_K"); !slices.Equal(res.Files, []string{"Tiny-Q4_K.gguf"}) {
		t.Fatalf("Q4_K picked %v", res.Files)
	}
	ref, _ := ParseRef("acme/Tiny-GGUF")
	_, err := c.Pull(context.Background(), ref, nil)
	if err == nil || !strings.Contains(err.Error(), "available: Q4_K, Q4_K_M, Q8_0") {
		t.Fatalf("without a quantization: %v", err)
	}
	ref, _ = ParseRef("acme/Tiny-GGUF:Q5_0")
	if _, err := c.Pull(context.Background(), ref, nil); !errors.Is(err, ErrNoModel) {
		t.Fatalf("missing quantization: %v", err)
	}
}

func TestChooseGGUFIncompleteSplit(t *testing.T) {
	_, err := chooseGGUF("a/b", []sibling{{Name: "X-Q8_0-00001-of-00003.gguf"}, {Name: "X-Q8_0-00002-of-00003.gguf"}}, "Q8_0")
	if err == nil || !strings.Contains(err.Error(), "split in 3 parts") {
		t.Fatalf("err %v", err)
	}
}

func TestParseRef(t *testing.T) {
	for in, want := range map[string]Ref{
		"Qwen/Qwen3-0.6B":                            {Repo: "Qwen/Qwen3-0.6B", Revision: "main"},
		"Qwen/Qwen3-0.6B@v1.0":                       {Repo: "Qwen/Qwen3-0.6B", Revision: "v1.0"},
		"unsloth/Qwen3-8B-GGUF:Q4_K_M":               {Repo: "unsloth/Qwen3-8B-GGUF", Revision: "main", Quant: "Q4_K_M"},
		"unsloth/Qwen3-8B-GGUF@" + commitA + ":Q8_0": {Repo: "unsloth/Qwen3-8B-GGUF", Revision: commitA, Quant: "Q8_0"},
		"https://huggingface.co/Qwen/Qwen3-0.6B":     {Repo: "Qwen/Qwen3-0.6B", Revision: "main"},
		"acme/x@refs/pr/1":                           {Repo: "acme/x", Revision: "refs/pr/1"},
	} {
		got, err := ParseRef(in)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "Qwen3", "a/b/c", "../x/y", "a--b/c", "a/b@../../x", "a/b:", "a/b:Q4 K", "/a/b"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func TestFromEnv(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HF_HOME", home)
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_TOKEN_PATH", "")
	t.Setenv("HF_ENDPOINT", "http://mirror.example/")
	t.Setenv("HF_HUB_OFFLINE", "yes")
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_fromfile\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := FromEnv()
	if c.Token != "hf_fromfile" || c.CacheDir != filepath.Join(home, "hub") || c.endpoint() != "http://mirror.example" || !c.Offline {
		t.Fatalf("%+v", c)
	}
	t.Setenv("HF_TOKEN", "hf_env")
	t.Setenv("HF_HUB_OFFLINE", "0")
	if c := FromEnv(); c.Token != "hf_env" || c.Offline {
		t.Fatalf("%+v", c)
	}
}

func TestProgressString(t *testing.T) {
	p := Progress{Done: 512 << 20, Total: 2 << 30, Speed: 40 << 20, ETA: 38 * time.Second}
	if got, want := p.String(), "512.0 MiB / 2.0 GiB (25%) · 40.0 MiB/s · ETA 38s"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	var m meter
	t0 := time.Unix(0, 0)
	for i := range 20 {
		m.add(t0.Add(time.Duration(i)*time.Second), 1000)
	}
	if s := m.speed(); s < 999 || s > 1001 {
		t.Fatalf("speed %g, want 1000 B/s", s)
	}
	if len(m.t) > 7 {
		t.Fatalf("meter kept %d samples", len(m.t))
	}
}
