package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The Hub's response headers the protocol reads.
const (
	headerRepoCommit   = "X-Repo-Commit"   // the commit a resolve request resolved to
	headerLinkedEtag   = "X-Linked-Etag"   // an LFS file's sha256 (ETag is then the pointer's)
	headerLinkedSize   = "X-Linked-Size"   // an LFS file's size
	headerErrorCode    = "X-Error-Code"    // RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo
	headerErrorMessage = "X-Error-Message" // the Hub's explanation
)

// repoInfo is the part of GET /api/models/{repo}/revision/{rev} that Pull
// reads.
type repoInfo struct {
	SHA      string    `json:"sha"`      // the commit the revision names
	Gated    any       `json:"gated"`    // false, "auto" or "manual"
	Siblings []sibling `json:"siblings"` // the files
}

// sibling is one file of the listing (with ?blobs=true: sizes and hashes).
type sibling struct {
	Name   string `json:"rfilename"`
	Size   int64  `json:"size"`
	BlobID string `json:"blobId"` // git blob sha1
	LFS    *struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	} `json:"lfs"`
}

// etag is the hash the listing gives for the file ("" when it gives none).
func (s sibling) etag() string {
	if s.LFS != nil {
		return s.LFS.SHA256
	}
	return s.BlobID
}

func (s sibling) size() int64 {
	if s.LFS != nil && s.LFS.Size > 0 {
		return s.LFS.Size
	}
	return s.Size
}

func (i repoInfo) gated() bool {
	switch g := i.Gated.(type) {
	case bool:
		return g
	case string:
		return g != "" && g != "false"
	}
	return false
}

// fileMeta is what HEAD on a file's resolve URL says.
type fileMeta struct {
	commit   string // X-Repo-Commit
	etag     string // X-Linked-Etag, else ETag, without W/ and quotes
	size     int64  // X-Linked-Size, else Content-Length
	location string // where to GET the contents
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// defaultHTTP bounds connecting and waiting for headers, not the body (a
// file may take hours); stalled bodies are caught by Client.Stall.
var defaultHTTP = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   15 * time.Second,
	ResponseHeaderTimeout: 60 * time.Second,
	MaxIdleConnsPerHost:   4,
	ForceAttemptHTTP2:     true,
}}

// newRequest is a request with the headers every Hub request carries; the
// token goes only to the Hub's own host.
func (c *Client) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "ferrite (huggingface_hub compatible)")
	if c.Token != "" && sameHost(u, c.endpoint()) {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

func sameHost(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Host == ub.Host
}

// repoInfo lists the files of repo at rev.
func (c *Client) repoInfo(ctx context.Context, repo, rev string) (repoInfo, error) {
	u := fmt.Sprintf("%s/api/models/%s/revision/%s?blobs=true", c.endpoint(), repo, url.PathEscape(rev))
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return repoInfo{}, err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return repoInfo{}, fmt.Errorf("%s: %w", repo, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return repoInfo{}, c.statusError(resp, repo, rev, "")
	}
	var info repoInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
		return repoInfo{}, fmt.Errorf("%s: the Hub's file list is not valid JSON: %w", repo, err)
	}
	if !commitHash.MatchString(info.SHA) {
		return repoInfo{}, fmt.Errorf("%s: the Hub's file list has no commit hash (got %q): is %s a Hugging Face Hub?", repo, info.SHA, c.endpoint())
	}
	return info, nil
}

// resolveURL is the URL of file in repo at rev.
func (c *Client) resolveURL(repo, rev, file string) string {
	parts := strings.Split(file, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return fmt.Sprintf("%s/%s/resolve/%s/%s", c.endpoint(), repo, url.PathEscape(rev), strings.Join(parts, "/"))
}

// maxRelativeRedirects bounds the redirects of a renamed repository.
const maxRelativeRedirects = 5

// head asks for a file's metadata. Redirects to the same host with a
// relative Location (a renamed repository) are followed; any other
// redirect is where the contents live, and its own headers carry the
// metadata.
func (c *Client) head(ctx context.Context, repo, rev, file string) (fileMeta, error) {
	u := c.resolveURL(repo, rev, file)
	hc := *c.httpClient()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for range maxRelativeRedirects + 1 {
		req, err := c.newRequest(ctx, http.MethodHead, u)
		if err != nil {
			return fileMeta{}, err
		}
		req.Header.Set("Accept-Encoding", "identity") // the size of the file, not of a compressed body
		resp, err := hc.Do(req)
		if err != nil {
			return fileMeta{}, fmt.Errorf("%s: %w", file, err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
			target, err := resp.Request.URL.Parse(loc)
			if err != nil {
				return fileMeta{}, fmt.Errorf("%s: bad redirect %q: %w", file, loc, err)
			}
			if p, _ := url.Parse(loc); p != nil && p.Host == "" {
				u = target.String() // relative: the repository moved; ask again there
				continue
			}
			return c.metaFrom(resp, file, target.String())
		}
		if resp.StatusCode != http.StatusOK {
			return fileMeta{}, c.statusError(resp, repo, rev, file)
		}
		return c.metaFrom(resp, file, u)
	}
	return fileMeta{}, fmt.Errorf("%s: more than %d redirects", file, maxRelativeRedirects)
}

// metaFrom reads the metadata headers of a HEAD response.
func (c *Client) metaFrom(resp *http.Response, file, location string) (fileMeta, error) {
	h := resp.Header
	m := fileMeta{commit: h.Get(headerRepoCommit), location: location, size: -1}
	m.etag = normalizeEtag(h.Get(headerLinkedEtag))
	if m.etag == "" {
		m.etag = normalizeEtag(h.Get("ETag"))
	}
	size := h.Get(headerLinkedSize)
	if size == "" {
		size = h.Get("Content-Length")
	}
	if n, err := strconv.ParseInt(size, 10, 64); err == nil && n >= 0 {
		m.size = n
	}
	switch {
	case !commitHash.MatchString(m.commit):
		return fileMeta{}, fmt.Errorf("%s: the server sent no commit (%s header): is %s a Hugging Face Hub?", file, headerRepoCommit, c.endpoint())
	case !isHash(m.etag):
		return fileMeta{}, fmt.Errorf("%s: the server sent no usable ETag (%q), so the download could not be verified", file, m.etag)
	case m.size < 0:
		return fileMeta{}, fmt.Errorf("%s: the server did not say the file's size", file)
	}
	return m, nil
}

// normalizeEtag drops a weak marker and the quotes.
func normalizeEtag(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "W/")
	return strings.Trim(s, `"`)
}

// isHash says whether s is a git sha1 or a sha256, in lowercase hex: the
// etags whose content Pull can verify (and safe as file names).
func isHash(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// statusError turns a failed response into an error that says what to
// do: the Hub answers 401 for a repository that does not exist or is
// private (without a token), and 401 or 403 for a gated one.
func (c *Client) statusError(resp *http.Response, repo, rev, file string) error {
	code := resp.Header.Get(headerErrorCode)
	msg := resp.Header.Get(headerErrorMessage)
	if msg == "" && resp.Body != nil && resp.Request != nil && resp.Request.Method != http.MethodHead {
		msg = hubErrorMessage(resp.Body)
	}
	detail := ""
	if msg != "" {
		detail = " (" + msg + ")"
	}
	page := c.endpoint() + "/" + repo
	switch {
	case code == "GatedRepo" || (resp.StatusCode == http.StatusForbidden && code != "RepoNotFound"):
		if c.Token == "" {
			return fmt.Errorf("%s is gated: accept its conditions at %s, then set HF_TOKEN (or log in with `hf auth login`): %w%s", repo, page, ErrAuth, detail)
		}
		return fmt.Errorf("%s is gated and this token has no access yet: accept its conditions at %s: %w%s", repo, page, ErrAuth, detail)
	case code == "RevisionNotFound":
		return fmt.Errorf("%s has no revision %q: %w%s", repo, rev, ErrNotFound, detail)
	case code == "EntryNotFound":
		return fmt.Errorf("%s@%s has no file %s: %w%s", repo, rev, file, ErrNotFound, detail)
	case code == "RepoNotFound" || resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized:
		if resp.StatusCode == http.StatusUnauthorized && c.Token == "" {
			return fmt.Errorf("%s: no such model repository on %s, or it is private (set HF_TOKEN): %w%s", repo, c.endpoint(), ErrNotFound, detail)
		}
		if resp.StatusCode == http.StatusUnauthorized {
			return fmt.Errorf("%s: no such model repository, or HF_TOKEN has no access to it (HTTP 401): %w%s", repo, ErrAuth, detail)
		}
		return fmt.Errorf("%s: no such model repository on %s: %w%s", repo, c.endpoint(), ErrNotFound, detail)
	}
	what := repo
	if file != "" {
		what += " " + file
	}
	return fmt.Errorf("%s: the Hub answered %s%s", what, resp.Status, detail)
}

// hubErrorMessage is the "error" of a JSON error body, if any.
func hubErrorMessage(body io.Reader) string {
	var e struct {
		Error string `json:"error"`
	}
	data, _ := io.ReadAll(io.LimitReader(body, 4096))
	if json.Unmarshal(data, &e) == nil {
		return e.Error
	}
	return ""
}
