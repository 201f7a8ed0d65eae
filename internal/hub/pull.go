package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ferrite-llm/ferrite/internal/units"
)

// Result is what a pull left in the cache.
type Result struct {
	Ref        Ref
	Commit     string   // the commit the revision named
	Dir        string   // the snapshot directory: a model directory ferrite opens
	Files      []string // the snapshot's files the pull fetched, in the Hub's names
	Size       int64    // their bytes
	Downloaded int64    // bytes transferred by this pull (0: all were cached)
	GGUF       bool     // the weights are GGUF files
	Offline    bool     // found in the cache without asking the Hub
}

// reportInterval bounds how often a download reports progress.
const reportInterval = 100 * time.Millisecond

// Pull downloads what ref needs into the cache and returns the snapshot.
// Files already in the cache are not fetched again; a download that was
// interrupted resumes where it stopped. progress (may be nil) is called
// from the download goroutines, one call at a time; it should not block
// long (the downloads wait for it). Offline, Pull only finds ref in the
// cache.
func (c *Client) Pull(ctx context.Context, ref Ref, progress func(Progress)) (Result, error) {
	if ref.Revision == "" {
		ref.Revision = "main"
	}
	if c.CacheDir == "" {
		return Result{}, errors.New("hub: no cache directory")
	}
	p := &puller{c: c, ref: ref, cache: c.cacheOf(ref.Repo), report: progress,
		have: map[string]int64{}, index: map[string]int{}}
	p.state = Progress{Repo: ref.Repo, ETA: -1}
	if c.Offline {
		return p.offline()
	}
	return p.pull(ctx)
}

// parallelFiles is how many files a pull downloads at once.
const parallelFiles = 4

// puller is one Pull. Its files download in parallel; mu guards the
// progress they share.
type puller struct {
	c      *Client
	ref    Ref
	cache  repoCache
	report func(Progress)
	index  map[string]int // a file's 1-based number in the pull; set before the downloads start

	mu    sync.Mutex
	state Progress
	have  map[string]int64 // the bytes present of each file
	meter meter
	last  time.Time // the last report during a download
}

// stage sets what the pull is doing, and reports it.
func (p *puller) stage(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state.Stage = s
	p.emit(true)
}

// progress says that n bytes of file name are present, of which received
// were just transferred; it reports at most every reportInterval unless
// force.
func (p *puller) progress(name string, n, received int64, force bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if received > 0 {
		p.meter.add(p.c.clock(), received)
	}
	p.state.Done += n - p.have[name]
	p.have[name] = n
	p.state.File, p.state.Index, p.state.FileDone = name, p.index[name], n
	p.emit(force)
}

// emit reports the state (with p.mu held); during a download at most
// every reportInterval unless force.
func (p *puller) emit(force bool) {
	if p.report == nil {
		return
	}
	now := p.c.clock()
	if !force && now.Sub(p.last) < reportInterval {
		return
	}
	p.last = now
	s := p.state
	s.Speed = p.meter.speed()
	s.ETA = -1
	if s.Speed > 0 && s.Total > s.Done {
		s.ETA = time.Duration(float64(s.Total-s.Done) / s.Speed * float64(time.Second))
	}
	p.report(s)
}

// offline finds the revision's snapshot in the cache.
func (p *puller) offline() (Result, error) {
	commit, err := p.cache.readRef(p.ref.Revision)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", p.ref, ErrOffline)
	}
	files, size, err := p.cache.cachedFiles(commit)
	if err != nil || len(files) == 0 {
		return Result{}, fmt.Errorf("%s (commit %s): %w", p.ref, commit[:12], ErrOffline)
	}
	sibs := make([]sibling, len(files))
	for i, f := range files {
		sibs[i] = sibling{Name: f}
	}
	pl, err := choose(p.ref.Repo, sibs, p.ref.Quant)
	if err != nil {
		return Result{}, fmt.Errorf("offline (HF_HUB_OFFLINE), and the cached snapshot is not usable: %w", err)
	}
	p.state.Files, p.state.Total, p.state.Done = len(files), size, size
	p.stage("done")
	return Result{Ref: p.ref, Commit: commit, Dir: p.cache.snapshot(commit), Files: names(pl.files()), Size: size, GGUF: pl.gguf, Offline: true}, nil
}

func names(s []sibling) []string {
	out := make([]string, len(s))
	for i, f := range s {
		out[i] = f.Name
	}
	return out
}

func (p *puller) pull(ctx context.Context) (Result, error) {
	p.stage("listing files")
	info, err := p.c.repoInfo(ctx, p.ref.Repo, p.ref.Revision)
	if err != nil {
		return Result{}, err
	}
	if info.gated() && p.c.Token == "" {
		return Result{}, fmt.Errorf("%s is gated: accept its conditions at %s/%s, then set HF_TOKEN (or log in with `hf auth login`): %w",
			p.ref.Repo, p.c.endpoint(), p.ref.Repo, ErrAuth)
	}
	for _, s := range info.Siblings {
		if !safeName(s.Name) {
			return Result{}, fmt.Errorf("%s: the Hub lists a file with an unsafe name %q", p.ref.Repo, s.Name)
		}
	}
	pl, err := choose(p.ref.Repo, info.Siblings, p.ref.Quant)
	if err != nil {
		return Result{}, err
	}
	commit := info.SHA
	res := Result{Ref: p.ref, Commit: commit, Dir: p.cache.snapshot(commit), GGUF: pl.gguf}

	// The index first: it says which safetensors files are the weights.
	if i := slices.IndexFunc(pl.meta, func(s sibling) bool { return s.Name == indexFile }); i >= 0 {
		if err := p.fetch(ctx, commit, pl.meta[i]); err != nil {
			return Result{}, err
		}
		shards, err := readIndex(p.cache.pointer(commit, indexFile))
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", p.ref.Repo, err)
		}
		if err := pl.narrowToIndex(p.ref.Repo, shards); err != nil {
			return Result{}, err
		}
	}
	files := pl.files()
	for i, f := range files {
		p.index[f.Name] = i + 1
		p.state.Total += f.size()
	}
	p.state.Files = len(files)
	if err := p.checkSpace(files); err != nil {
		return Result{}, err
	}
	p.stage("downloading")
	if err := p.fetchAll(ctx, commit, files); err != nil {
		return Result{}, err
	}
	if err := p.cache.writeRef(p.ref.Revision, commit); err != nil {
		return Result{}, fmt.Errorf("writing refs/%s: %w", p.ref.Revision, err)
	}
	res.Files = names(files)
	for _, f := range files {
		if n, ok := fileSize(p.cache.pointer(commit, f.Name)); ok {
			res.Size += n
		}
	}
	res.Downloaded = p.meter.total
	p.state.File, p.state.Done = "", p.state.Total
	p.stage("done")
	return res, nil
}

// fetchAll fetches files, parallelFiles at a time; the first failure
// stops the others (their partial downloads stay, to be resumed).
func (p *puller) fetchAll(ctx context.Context, commit string, files []sibling) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	slots := make(chan struct{}, parallelFiles)
	for _, f := range files {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := p.fetch(ctx, commit, f); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// readIndex lists the shards a safetensors index names, each once, sorted.
func readIndex(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", indexFile, err)
	}
	var shards []string
	for _, f := range idx.WeightMap {
		if !safeName(f) {
			return nil, fmt.Errorf("%s names an unsafe file %q", indexFile, f)
		}
		if !slices.Contains(shards, f) {
			shards = append(shards, f)
		}
	}
	if len(shards) == 0 {
		return nil, fmt.Errorf("%s has an empty weight_map", indexFile)
	}
	slices.Sort(shards)
	return shards, nil
}

// checkSpace fails when the blobs still to download (less what their
// .incomplete files hold) do not fit on the disk.
func (p *puller) checkSpace(files []sibling) error {
	var need int64
	for _, f := range files {
		etag := f.etag()
		if !isHash(etag) {
			need += f.size() // unknown until its HEAD: count it whole
			continue
		}
		if _, ok := fileSize(p.cache.blob(etag)); ok {
			continue
		}
		part, _ := fileSize(p.cache.blob(etag) + ".incomplete")
		need += max(f.size()-part, 0)
	}
	if need == 0 {
		return nil
	}
	dir := filepath.Join(p.cache.dir, "blobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating the cache: %w", err)
	}
	free := freeBytes
	if p.c.freeSpace != nil {
		free = p.c.freeSpace
	}
	avail, err := free(dir)
	if err != nil || avail < 0 {
		return nil // unknown: the writes will tell
	}
	if need > avail {
		return fmt.Errorf("%s needs %s more and %s has %s free: %w", p.ref, units.Bytes(need), p.c.CacheDir, units.Bytes(avail), ErrDiskFull)
	}
	return nil
}
