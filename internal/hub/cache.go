package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// repoCache is the cache folder of one repository.
type repoCache struct {
	dir  string // .../models--ORG--NAME
	lock string // .../.locks/models--ORG--NAME
}

func (c *Client) cacheOf(repo string) repoCache {
	dir := c.repoFolder(repo)
	return repoCache{dir: dir, lock: filepath.Join(c.CacheDir, ".locks", filepath.Base(dir))}
}

func (r repoCache) blob(etag string) string { return filepath.Join(r.dir, "blobs", etag) }

func (r repoCache) snapshot(commit string) string {
	return filepath.Join(r.dir, "snapshots", commit)
}

// pointer is a file's place in a snapshot; name uses '/' (the Hub's).
func (r repoCache) pointer(commit, name string) string {
	return filepath.Join(r.snapshot(commit), filepath.FromSlash(name))
}

// safeName says whether a file name from the Hub stays inside the
// snapshot: relative, without "." or ".." parts or backslashes.
func safeName(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, `\`) {
		return false
	}
	for _, p := range strings.Split(name, "/") {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return true
}

// link points the snapshot's name at the blob of etag with a relative
// symbolic link (../../blobs/ETAG, one more ../ per subfolder), replacing
// whatever was there.
func (r repoCache) link(commit, name, etag string) error {
	ptr := r.pointer(commit, name)
	if err := os.MkdirAll(filepath.Dir(ptr), 0o755); err != nil {
		return err
	}
	target, err := filepath.Rel(filepath.Dir(ptr), r.blob(etag))
	if err != nil {
		return err
	}
	if cur, err := os.Readlink(ptr); err == nil && cur == target {
		return nil
	}
	tmp := ptr + ".tmp-link"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, ptr); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// writeRef records that rev names commit (refs/main, refs/v1.0…); a
// commit hash gets no ref.
func (r repoCache) writeRef(rev, commit string) error {
	if rev == commit {
		return nil
	}
	p := filepath.Join(r.dir, "refs", filepath.FromSlash(rev))
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == commit {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return writeFileAtomic(p, []byte(commit))
}

// readRef is the commit rev names in the cache: rev itself when it is a
// commit hash, else refs/<rev>.
func (r repoCache) readRef(rev string) (string, error) {
	if commitHash.MatchString(rev) {
		return rev, nil
	}
	data, err := os.ReadFile(filepath.Join(r.dir, "refs", filepath.FromSlash(rev)))
	if err != nil {
		return "", err
	}
	c := strings.TrimSpace(string(data))
	if !commitHash.MatchString(c) {
		return "", fmt.Errorf("refs/%s holds %q, not a commit hash", rev, c)
	}
	return c, nil
}

// cachedFiles lists the files of a snapshot whose links resolve.
func (r repoCache) cachedFiles(commit string) ([]string, int64, error) {
	snap := r.snapshot(commit)
	var names []string
	var size int64
	err := filepath.WalkDir(snap, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		st, err := os.Stat(p) // follows the link to the blob
		if err != nil {
			return nil // a dangling link: not cached
		}
		rel, _ := filepath.Rel(snap, p)
		names = append(names, filepath.ToSlash(rel))
		size += st.Size()
		return nil
	})
	return names, size, err
}

// writeFileAtomic writes data to a temporary file next to path and
// renames it into place.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}

func fileSize(p string) (int64, bool) {
	st, err := os.Stat(p)
	if err != nil || !st.Mode().IsRegular() {
		return 0, false
	}
	return st.Size(), true
}
