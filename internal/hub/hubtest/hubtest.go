// Package hubtest is a fake Hugging Face Hub on loopback for tests: the
// file-list API, resolve URLs that answer small files themselves and
// redirect LFS files to a second server (the CDN, another host), with the
// Hub's headers and error codes, and switches to make it misbehave.
package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Hub's headers (internal/hub reads them).
const (
	headerRepoCommit   = "X-Repo-Commit"
	headerLinkedEtag   = "X-Linked-Etag"
	headerLinkedSize   = "X-Linked-Size"
	headerErrorCode    = "X-Error-Code"
	headerErrorMessage = "X-Error-Message"
)

// Hub is the fake Hub. Set its switches before the requests they affect.
type Hub struct {
	URL   string // the Hub's address: HF_ENDPOINT
	Token string // the token of a user with access to gated repositories

	hub *httptest.Server
	cdn *httptest.Server

	mu       sync.Mutex
	repos    map[string]*Repo
	renamed  map[string]string // old repo id → new one (relative redirects)
	cutOnce  map[string]int    // file → bytes after which its next GET is cut
	stallAt  map[string]int    // file → bytes after which its next GET stalls until the client leaves
	corrupt  map[string]bool   // file → served with one byte flipped
	ranges   []string          // the Range headers the servers saw, "file=range"
	cdnGets  int
	requests int
	auths    map[string]string // "hub" / "cdn" → the last Authorization seen
	rate     int               // bytes per second of every transfer; 0: as fast as possible
	inflight int               // GETs being answered
	most     int               // the most GETs answered at once
}

// Repo is one repository of the Hub.
type Repo struct {
	Commit string
	Gated  bool // downloads need Hub.Token
	files  []file
}

type file struct {
	name string
	data []byte
	lfs  bool
}

// SHA256 is the hex sha256 of data (an LFS file's etag).
func SHA256(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// GitSHA1 is git's blob hash of data (a small file's etag).
func GitSHA1(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// New starts a Hub; it stops when the test ends (t is a testing.TB, or
// anything that runs cleanups, for a Hub outside tests).
func New(t interface{ Cleanup(func()) }) *Hub {
	f := &Hub{repos: map[string]*Repo{}, renamed: map[string]string{},
		cutOnce: map[string]int{}, stallAt: map[string]int{}, corrupt: map[string]bool{}, auths: map[string]string{}}
	f.hub = httptest.NewServer(http.HandlerFunc(f.serveHub))
	f.cdn = httptest.NewServer(http.HandlerFunc(f.serveCDN))
	f.URL = f.hub.URL
	t.Cleanup(func() { f.hub.Close(); f.cdn.Close() })
	return f
}

// Add puts a repository on the Hub, at commit (40 hex digits); files
// ending in .safetensors or .gguf are LFS files, served by the CDN.
func (f *Hub) Add(repo, commit string, files map[string]string) *Repo {
	r := &Repo{Commit: commit}
	for name, data := range files {
		lfs := strings.HasSuffix(name, ".safetensors") || strings.HasSuffix(name, ".gguf")
		r.files = append(r.files, file{name: name, data: []byte(data), lfs: lfs})
	}
	slices.SortFunc(r.files, func(a, b file) int { return strings.Compare(a.name, b.name) }) // the Hub lists them sorted
	f.mu.Lock()
	f.repos[repo] = r
	f.mu.Unlock()
	return r
}

// Rename makes old answer with relative redirects to new, like a
// renamed repository.
func (f *Hub) Rename(old, new string) { f.set(func() { f.renamed[old] = new }) }

// CutOnce makes the next GET of file end after n bytes (the connection drops).
func (f *Hub) CutOnce(file string, n int) { f.set(func() { f.cutOnce[file] = n }) }

// StallOnce makes the next GET of file stop sending after n bytes, until
// the client gives up.
func (f *Hub) StallOnce(file string, n int) { f.set(func() { f.stallAt[file] = n }) }

// Throttle limits every transfer to n bytes per second (0: no limit).
func (f *Hub) Throttle(n int) { f.set(func() { f.rate = n }) }

// Corrupt serves file with one byte flipped (on) or right (off).
func (f *Hub) Corrupt(file string, on bool) { f.set(func() { f.corrupt[file] = on }) }

func (f *Hub) set(change func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change()
}

// Auth is the last Authorization header the Hub ("hub") or the CDN
// ("cdn") received.
func (f *Hub) Auth(server string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.auths[server]
}

// Count is the requests the Hub received and the GETs the CDN received.
func (f *Hub) Count() (requests, cdnGets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, f.cdnGets
}

// MostAtOnce is the most file GETs the Hub and the CDN answered at the
// same time.
func (f *Hub) MostAtOnce() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.most
}

// Ranges are the Range headers received, as "FILE=bytes=N-".
func (f *Hub) Ranges() []string {
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
func (f *Hub) lookup(w http.ResponseWriter, r *http.Request, repo, rest string) (*Repo, bool) {
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

func (f *Hub) serveHub(w http.ResponseWriter, r *http.Request) {
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
		if rev := parts[3]; rev != "main" && rev != rp.Commit {
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
func (f *Hub) list(w http.ResponseWriter, r *http.Request, rp *Repo) {
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
	}{SHA: rp.Commit, Gated: false}
	if rp.Gated {
		out.Gated = "manual"
	}
	for _, fl := range rp.files {
		s := sib{Name: fl.name, Size: len(fl.data), BlobID: GitSHA1(fl.data)}
		if fl.lfs {
			s.LFS = &lfs{SHA256: SHA256(fl.data), Size: len(fl.data)}
			s.Size = len(fl.data)
		}
		out.Siblings = append(out.Siblings, s)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// resolve answers HEAD and GET /{repo}/resolve/{rev}/{file} like the Hub.
func (f *Hub) resolve(w http.ResponseWriter, r *http.Request, rp *Repo, rev, name string) {
	if rp.Gated && r.Header.Get("Authorization") != "Bearer "+f.Token {
		status := http.StatusUnauthorized
		if r.Header.Get("Authorization") != "" {
			status = http.StatusForbidden
		}
		hubError(w, status, "GatedRepo", "Access to model is restricted")
		return
	}
	if rev != "main" && rev != rp.Commit {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id")
		return
	}
	var fl *file
	for i := range rp.files {
		if rp.files[i].name == name {
			fl = &rp.files[i]
		}
	}
	w.Header().Set(headerRepoCommit, rp.Commit)
	if fl == nil {
		hubError(w, http.StatusNotFound, "EntryNotFound", name+" does not exist")
		return
	}
	if fl.lfs {
		w.Header().Set(headerLinkedEtag, `"`+SHA256(fl.data)+`"`)
		w.Header().Set(headerLinkedSize, strconv.Itoa(len(fl.data)))
		w.Header().Set("ETag", `"`+GitSHA1(fl.data)+`"`) // the pointer's, which the client must not use
		w.Header().Set("Location", f.cdn.URL+"/blob/"+SHA256(fl.data)+"?file="+fl.name)
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitSHA1(fl.data)+`"`)
	f.serveBytes(w, r, fl)
}

func (f *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.cdnGets++
	f.auths["cdn"] = r.Header.Get("Authorization")
	var fl *file
	sha := strings.TrimPrefix(r.URL.Path, "/blob/")
	for _, rp := range f.repos {
		for i := range rp.files {
			if rp.files[i].lfs && SHA256(rp.files[i].data) == sha {
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
func (f *Hub) serveBytes(w http.ResponseWriter, r *http.Request, fl *file) {
	data := fl.data
	f.mu.Lock()
	if f.corrupt[fl.name] && len(data) > 0 {
		data = append([]byte(nil), data...)
		data[len(data)/2] ^= 0xff
	}
	rate := f.rate
	cut, cutting := f.cutOnce[fl.name]
	stall, stalling := f.stallAt[fl.name]
	if r.Method == http.MethodGet {
		delete(f.cutOnce, fl.name)
		delete(f.stallAt, fl.name)
		f.inflight++
		f.most = max(f.most, f.inflight)
		defer f.set(func() { f.inflight-- })
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
	for rate > 0 && len(body) > 0 {
		n := min(len(body), rate/10)
		if _, err := w.Write(body[:n]); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		body = body[n:]
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = w.Write(body)
}
