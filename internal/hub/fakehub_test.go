package hub

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeHub is a Hugging Face Hub on loopback: the file-list API, resolve
// URLs that answer small files themselves and redirect LFS files to a
// second server (the CDN, another host), with the Hub's headers and error
// codes, and switches to misbehave.
type fakeHub struct {
	t     *testing.T
	hub   *httptest.Server
	cdn   *httptest.Server
	token string // the token of a user with access to gated repositories

	mu       sync.Mutex
	repos    map[string]*fakeRepo
	renamed  map[string]string // old repo id → new one (relative redirects)
	cutOnce  map[string]int    // file → bytes after which its next GET is cut
	stallAt  map[string]int    // file → bytes after which its next GET stalls until the client leaves
	corrupt  map[string]bool   // file → served with one byte flipped
	ranges   []string          // the Range headers the CDN saw, "file=range"
	cdnGets  int
	requests int
	auths    map[string]string // "hub" / "cdn" → the last Authorization seen
}

type fakeRepo struct {
	commit string
	gated  bool
	files  []fakeFile
}

type fakeFile struct {
	name string
	data []byte
	lfs  bool
}

func (f fakeFile) sha256() string {
	s := sha256.Sum256(f.data)
	return hex.EncodeToString(s[:])
}

func (f fakeFile) gitSHA1() string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(f.data))
	h.Write(f.data)
	return hex.EncodeToString(h.Sum(nil))
}

func newFakeHub(t *testing.T) *fakeHub {
	f := &fakeHub{t: t, repos: map[string]*fakeRepo{}, renamed: map[string]string{},
		cutOnce: map[string]int{}, stallAt: map[string]int{}, corrupt: map[string]bool{}, auths: map[string]string{}}
	f.hub = httptest.NewServer(http.HandlerFunc(f.serveHub))
	f.cdn = httptest.NewServer(http.HandlerFunc(f.serveCDN))
	t.Cleanup(func() { f.hub.Close(); f.cdn.Close() })
	return f
}

// add puts a repository on the hub; files ending in .safetensors or .gguf
// are LFS files.
func (f *fakeHub) add(repo, commit string, files map[string]string) *fakeRepo {
	r := &fakeRepo{commit: commit}
	for name, data := range files {
		lfs := strings.HasSuffix(name, ".safetensors") || strings.HasSuffix(name, ".gguf")
		r.files = append(r.files, fakeFile{name: name, data: []byte(data), lfs: lfs})
	}
	f.mu.Lock()
	f.repos[repo] = r
	f.mu.Unlock()
	return r
}

func (f *fakeHub) client(t *testing.T) *Client {
	return &Client{Endpoint: f.hub.URL, CacheDir: t.TempDir(), retryBase: 1}
}

func (f *fakeHub) count() (requests, cdnGets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, f.cdnGets
}

func (f *fakeHub) seenRanges() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ranges...)
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set(headerErrorCode, code)
	w.Header().Set(headerErrorMessage, msg)
	w.WriteHeader(status)
}

// lookup finds a repository, answering a redirect or an error when it is
// not there as asked.
func (f *fakeHub) lookup(w http.ResponseWriter, r *http.Request, repo, rest string) (*fakeRepo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if to, ok := f.renamed[repo]; ok {
		w.Header().Set("Location", strings.Replace(r.URL.Path, repo, to, 1)+rest)
		w.WriteHeader(http.StatusTemporaryRedirect)
		return nil, false
	}
	rp := f.repos[repo]
	if rp == nil {
		if r.Header.Get("Authorization") == "" {
			hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
		} else {
			hubError(w, http.StatusNotFound, "RepoNotFound", "Repository not found")
		}
		return nil, false
	}
	return rp, true
}

func (f *fakeHub) serveHub(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.auths["hub"] = r.Header.Get("Authorization")
	f.mu.Unlock()
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/api/models/"); ok {
		parts := strings.SplitN(rest, "/", 4) // org, name, "revision", rev
		if len(parts) != 4 || parts[2] != "revision" {
			http.NotFound(w, r)
			return
		}
		rp, ok := f.lookup(w, r, parts[0]+"/"+parts[1], "?"+r.URL.RawQuery)
		if !ok {
			return
		}
		if rev := parts[3]; rev != "main" && rev != rp.commit {
			hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
			return
		}
		f.list(w, r, rp)
		return
	}
	parts := strings.SplitN(strings.TrimPrefix(path, "/"), "/", 5) // org, name, "resolve", rev, file
	if len(parts) != 5 || parts[2] != "resolve" {
		http.NotFound(w, r)
		return
	}
	rp, ok := f.lookup(w, r, parts[0]+"/"+parts[1], "")
	if !ok {
		return
	}
	f.resolve(w, r, rp, parts[3], parts[4])
}

// list answers /api/models/…/revision/… with ?blobs=true's fields.
func (f *fakeHub) list(w http.ResponseWriter, r *http.Request, rp *fakeRepo) {
	type lfs struct {
		SHA256 string `json:"sha256"`
		Size   int    `json:"size"`
	}
	type sib struct {
		Name   string `json:"rfilename"`
		Size   int    `json:"size"`
		BlobID string `json:"blobId"`
		LFS    *lfs   `json:"lfs,omitempty"`
	}
	out := struct {
		ID       string `json:"id"`
		SHA      string `json:"sha"`
		Gated    any    `json:"gated"`
		Siblings []sib  `json:"siblings"`
	}{SHA: rp.commit, Gated: false}
	if rp.gated {
		out.Gated = "manual"
	}
	for _, fl := range rp.files {
		s := sib{Name: fl.name, Size: len(fl.data), BlobID: fl.gitSHA1()}
		if fl.lfs {
			s.LFS = &lfs{SHA256: fl.sha256(), Size: len(fl.data)}
			s.Size = len(fl.data)
		}
		out.Siblings = append(out.Siblings, s)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// resolve answers HEAD and GET /{repo}/resolve/{rev}/{file} like the Hub.
func (f *fakeHub) resolve(w http.ResponseWriter, r *http.Request, rp *fakeRepo, rev, name string) {
	if rp.gated && r.Header.Get("Authorization") != "Bearer "+f.token {
		status := http.StatusUnauthorized
		if r.Header.Get("Authorization") != "" {
			status = http.StatusForbidden
		}
		hubError(w, status, "GatedRepo", "Access to model is restricted")
		return
	}
	if rev != "main" && rev != rp.commit {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id")
		return
	}
	var fl *fakeFile
	for i := range rp.files {
		if rp.files[i].name == name {
			fl = &rp.files[i]
		}
	}
	w.Header().Set(headerRepoCommit, rp.commit)
	if fl == nil {
		hubError(w, http.StatusNotFound, "EntryNotFound", name+" does not exist")
		return
	}
	if fl.lfs {
		w.Header().Set(headerLinkedEtag, `"`+fl.sha256()+`"`)
		w.Header().Set(headerLinkedSize, strconv.Itoa(len(fl.data)))
		w.Header().Set("ETag", `"`+fl.gitSHA1()+`"`) // the pointer's, which the client must not use
		w.Header().Set("Location", f.cdn.URL+"/blob/"+fl.sha256()+"?file="+fl.name)
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+fl.gitSHA1()+`"`)
	f.serveBytes(w, r, fl)
}

func (f *fakeHub) serveCDN(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.cdnGets++
	f.auths["cdn"] = r.Header.Get("Authorization")
	var fl *fakeFile
	sha := strings.TrimPrefix(r.URL.Path, "/blob/")
	for _, rp := range f.repos {
		for i := range rp.files {
			if rp.files[i].lfs && rp.files[i].sha256() == sha {
				fl = &rp.files[i]
			}
		}
	}
	f.mu.Unlock()
	if fl == nil {
		http.NotFound(w, r)
		return
	}
	f.serveBytes(w, r, fl)
}

// serveBytes writes a file, honouring "Range: bytes=N-", cutting or
// corrupting it when told to.
func (f *fakeHub) serveBytes(w http.ResponseWriter, r *http.Request, fl *fakeFile) {
	data := fl.data
	f.mu.Lock()
	if f.corrupt[fl.name] && len(data) > 0 {
		data = append([]byte(nil), data...)
		data[len(data)/2] ^= 0xff
	}
	cut, cutting := f.cutOnce[fl.name]
	stall, stalling := f.stallAt[fl.name]
	if r.Method == http.MethodGet {
		delete(f.cutOnce, fl.name)
		delete(f.stallAt, fl.name)
	} else {
		cutting, stalling = false, false
	}
	if rg := r.Header.Get("Range"); rg != "" {
		f.ranges = append(f.ranges, fl.name+"="+rg)
	}
	f.mu.Unlock()
	start := 0
	if rg := r.Header.Get("Range"); rg != "" {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
		if err != nil || n >= len(data) {
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(data)-1, len(data)))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)-start))
	if start > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	if r.Method == http.MethodHead {
		return
	}
	body := data[start:]
	if cutting && cut < len(body) {
		_, _ = w.Write(body[:cut])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // drops the connection mid-body
	}
	if stalling && stall < len(body) {
		_, _ = w.Write(body[:stall])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	_, _ = w.Write(body)
}
