package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferrite-llm/ferrite/internal/units"
)

// Retries of one file's transfer: a cut connection, a stalled body or a
// 5xx/429 answer is retried from where it stopped, after 1 s, 2 s, 4 s…
const (
	maxAttempts = 5
	lockPoll    = 250 * time.Millisecond // how often a busy lock is tried again
	copyBuffer  = 1 << 20
)

// retryableError marks a failure worth another attempt.
type retryableError struct{ err error }

func (e retryableError) Error() string { return e.err.Error() }
func (e retryableError) Unwrap() error { return e.err }

// fetch puts one file of commit in the cache: its blob (downloaded,
// unless some snapshot already has it) and its link in the snapshot.
func (p *puller) fetch(ctx context.Context, commit string, f sibling) error {
	if n, ok := fileSize(p.cache.pointer(commit, f.Name)); ok {
		p.progress(f.Name, n, 0, true)
		return nil
	}
	if etag := f.etag(); isHash(etag) { // another snapshot has the blob already
		if n, ok := fileSize(p.cache.blob(etag)); ok && n == f.size() {
			if err := p.cache.link(commit, f.Name, etag); err != nil {
				return fmt.Errorf("linking %s into the snapshot: %w", f.Name, err)
			}
			p.progress(f.Name, n, 0, true)
			return nil
		}
	}
	meta, err := p.c.head(ctx, p.ref.Repo, commit, f.Name)
	if err != nil {
		return err
	}
	if meta.commit != commit {
		return fmt.Errorf("%s: the Hub resolved commit %s to %s", f.Name, commit, meta.commit)
	}
	if want := f.etag(); want != "" && want != meta.etag {
		return fmt.Errorf("%s: the file list says its hash is %s but the file's ETag is %s: %w", f.Name, want, meta.etag, ErrChecksum)
	}
	if err := p.fetchBlob(ctx, f.Name, meta); err != nil {
		return err
	}
	if err := p.cache.link(commit, f.Name, meta.etag); err != nil {
		return fmt.Errorf("linking %s into the snapshot: %w", f.Name, err)
	}
	p.progress(f.Name, meta.size, 0, true)
	return nil
}

// fetchBlob downloads the blob of meta unless it is there, holding the
// blob's lock meanwhile.
func (p *puller) fetchBlob(ctx context.Context, name string, meta fileMeta) error {
	blob := p.cache.blob(meta.etag)
	if _, ok := fileSize(blob); ok {
		return nil
	}
	for _, d := range []string{filepath.Dir(blob), p.cache.lock} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating the cache: %w", err)
		}
	}
	unlock, err := p.lock(ctx, name, filepath.Join(p.cache.lock, meta.etag+".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := fileSize(blob); ok { // the other pull finished it
		return nil
	}
	wait := p.c.retryWait()
	for attempt := 1; ; attempt++ {
		err := p.transfer(ctx, name, meta, blob+".incomplete")
		var re retryableError
		if err == nil || !errors.As(err, &re) || attempt == maxAttempts || ctx.Err() != nil {
			if err == nil {
				err = os.Rename(blob+".incomplete", blob)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// retryWait is the wait before the first retry.
func (c *Client) retryWait() time.Duration {
	if c.retryBase > 0 {
		return c.retryBase
	}
	return time.Second
}

// lock takes the blob's lock, waiting (and saying so) while another pull
// holds it.
func (p *puller) lock(ctx context.Context, name, path string) (unlock func(), err error) {
	for waited := false; ; waited = true {
		f, busy, err := tryLock(path)
		if err != nil {
			return nil, fmt.Errorf("locking %s: %w", name, err)
		}
		if !busy {
			if waited {
				p.stage("downloading")
			}
			return func() { f.Close() }, nil
		}
		if !waited {
			p.stage("waiting for another pull of " + name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

// transfer is one attempt at a blob: it resumes the .incomplete file inc
// with a Range request, and checks the whole file's size and hash at the
// end. A failed check removes inc (the next pull starts afresh).
func (p *puller) transfer(ctx context.Context, name string, meta fileMeta, inc string) error {
	f, err := os.OpenFile(inc, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer f.Close()
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if off > meta.size {
		if off, err = restart(f); err != nil {
			return err
		}
	}
	h := newHasher(meta.etag, meta.size)
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, off)); err != nil {
		return fmt.Errorf("%s: reading the partial download: %w", name, err)
	}
	p.progress(name, off, 0, true)
	if off < meta.size {
		if err := p.receive(ctx, name, meta, f, h, off); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return diskError(name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != meta.etag {
		f.Close()
		_ = os.Remove(inc)
		return fmt.Errorf("%s: downloaded %s with hash %s, want %s; the download was removed, pull again to retry: %w",
			name, units.Bytes(meta.size), got, meta.etag, ErrChecksum)
	}
	return nil
}

// restart empties the partial file.
func restart(f *os.File) (int64, error) {
	if err := f.Truncate(0); err != nil {
		return 0, err
	}
	return f.Seek(0, io.SeekStart)
}

// receive GETs the file from byte off on, appending to f and h.
func (p *puller) receive(ctx context.Context, name string, meta fileMeta, f *os.File, h hash.Hash, off int64) error {
	stall := p.c.Stall
	if stall <= 0 {
		stall = time.Minute
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchdog := time.AfterFunc(stall, cancel)
	defer watchdog.Stop()

	req, err := p.c.newRequest(actx, http.MethodGet, meta.location)
	if err != nil {
		return err
	}
	req.Header.Set("Accept-Encoding", "identity")
	if off > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
	}
	resp, err := p.c.httpClient().Do(req)
	if err != nil {
		return p.netError(ctx, name, err, stall)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent && off > 0:
		if !strings.HasPrefix(resp.Header.Get("Content-Range"), fmt.Sprintf("bytes %d-", off)) {
			_, _ = restart(f)
			return retryableError{fmt.Errorf("%s: the server resumed at the wrong place (Content-Range %q)", name, resp.Header.Get("Content-Range"))}
		}
	case resp.StatusCode == http.StatusOK:
		if off > 0 { // the server ignored Range: start over
			if off, err = restart(f); err != nil {
				return err
			}
			h.Reset()
			writeBlobHeader(h, meta.etag, meta.size)
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		_, _ = restart(f)
		return retryableError{fmt.Errorf("%s: the server refused to resume at byte %d", name, off)}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return retryableError{fmt.Errorf("%s: the server answered %s", name, resp.Status)}
	default:
		return p.c.statusError(resp, p.ref.Repo, p.ref.Revision, name)
	}
	buf := make([]byte, copyBuffer)
	for off < meta.size {
		n, rerr := resp.Body.Read(buf[:min(int64(len(buf)), meta.size-off)])
		if n > 0 {
			watchdog.Reset(stall)
			if _, err := f.Write(buf[:n]); err != nil {
				return diskError(name, err)
			}
			h.Write(buf[:n])
			off += int64(n)
			p.progress(name, off, int64(n), false)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return p.netError(ctx, name, rerr, stall)
		}
	}
	if off < meta.size {
		return retryableError{fmt.Errorf("%s: the connection ended after %s of %s", name, units.Bytes(off), units.Bytes(meta.size))}
	}
	return nil
}

// netError classifies a failed request or read: the pull's own
// cancellation is final, anything else (a stall, a reset) is retried.
func (p *puller) netError(ctx context.Context, name string, err error, stall time.Duration) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, context.Canceled) {
		return retryableError{fmt.Errorf("%s: no data for %s", name, stall)}
	}
	return retryableError{fmt.Errorf("%s: %w", name, err)}
}

// diskError names a full disk as such.
func diskError(name string, err error) error {
	if isNoSpace(err) {
		return fmt.Errorf("writing %s: %w (%v); free some space and pull again: it resumes", name, ErrDiskFull, err)
	}
	return fmt.Errorf("writing %s: %w", name, err)
}

// newHasher is the hash an etag is: sha256 of the contents for an LFS
// file (64 hex digits), else git's blob sha1 ("blob SIZE\0" + contents).
func newHasher(etag string, size int64) hash.Hash {
	var h hash.Hash
	if len(etag) == 64 {
		h = sha256.New()
	} else {
		h = sha1.New()
	}
	writeBlobHeader(h, etag, size)
	return h
}

func writeBlobHeader(h hash.Hash, etag string, size int64) {
	if len(etag) != 64 {
		h.Write([]byte("blob " + strconv.FormatInt(size, 10) + "\x00"))
	}
}
