// Package hub downloads models from the Hugging Face Hub into the standard
// Hugging Face cache, the way the Python huggingface_hub library does, so
// that Python tools and ferrite's catalog (internal/catalog) both see them:
//
//	$HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
//	└── models--ORG--NAME/
//	    ├── blobs/<etag>                 file contents, named by their hash
//	    ├── snapshots/<commit>/<file>    relative symbolic links to blobs
//	    └── refs/<revision>              the commit a branch or tag named
//	.locks/models--ORG--NAME/<etag>.lock one download of a blob at a time
//
// The protocol: GET /api/models/ORG/NAME/revision/REV?blobs=true lists the
// files of a commit; for each file, HEAD /ORG/NAME/resolve/COMMIT/FILE
// (relative redirects followed, others not) gives its etag (X-Linked-Etag
// for LFS files, else ETag), size (X-Linked-Size, else Content-Length) and
// where to GET it (Location: a CDN for large files). A blob is written to
// blobs/<etag>.incomplete, resumed with Range after an interruption, and
// renamed once its checksum is right: the sha256 of an LFS file, the git
// blob sha1 of a small one (both are its etag).
//
// Only the files a model needs are fetched: configuration, tokenizer and
// chat template files and the safetensors weights (the shards the index
// names), or, for a GGUF repository, the file(s) of one quantization.
package hub

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/internal/catalog"
)

// DefaultEndpoint is the Hub HF_ENDPOINT replaces.
const DefaultEndpoint = "https://huggingface.co"

// The errors Pull can fail with, for errors.Is; the messages say more.
var (
	ErrNotFound = errors.New("not found on the Hub")                          // repository, revision or file
	ErrAuth     = errors.New("access denied")                                 // a gated or private repository
	ErrChecksum = errors.New("checksum mismatch")                             // a download whose hash is not its etag
	ErrDiskFull = errors.New("not enough disk space")                         // before starting, or a write that hit ENOSPC
	ErrOffline  = errors.New("offline (HF_HUB_OFFLINE) and not in the cache") // nothing to use without the network
	ErrNoModel  = errors.New("no weights ferrite can use")                    // no safetensors, no GGUF file of the quantization
)

// Client pulls models. FromEnv makes one from the environment; the zero
// value of every field but CacheDir has a sensible default.
type Client struct {
	Endpoint string       // the Hub's URL; "": DefaultEndpoint
	Token    string       // sent as a bearer token to Endpoint; "": none
	CacheDir string       // the hub cache (catalog.HubCacheDir())
	Offline  bool         // use only the cache (HF_HUB_OFFLINE)
	HTTP     *http.Client // nil: a client with connection and header timeouts
	// Stall is how long a download may go without receiving a byte before
	// it is retried from where it stopped; 0: one minute.
	Stall time.Duration
	// freeSpace reports the bytes free under a directory; nil: the file
	// system's (tests replace it).
	freeSpace func(dir string) (int64, error)
	now       func() time.Time // nil: time.Now
	retryBase time.Duration    // the wait before the first retry; 0: one second
}

// FromEnv is a client configured like huggingface_hub: HF_ENDPOINT,
// HF_TOKEN (else the token file: $HF_TOKEN_PATH, else $HF_HOME/token),
// HF_HUB_OFFLINE, and the cache catalog.HubCacheDir names.
func FromEnv() *Client {
	return &Client{
		Endpoint: strings.TrimRight(os.Getenv("HF_ENDPOINT"), "/"),
		Token:    envToken(),
		CacheDir: catalog.HubCacheDir(),
		Offline:  envTrue(os.Getenv("HF_HUB_OFFLINE")),
	}
}

// hfHome is $HF_HOME, else $XDG_CACHE_HOME/huggingface.
func hfHome() string {
	if d := os.Getenv("HF_HOME"); d != "" {
		return d
	}
	return filepath.Join(xdg.CacheHome, "huggingface")
}

// envToken is HF_TOKEN, else the first line of the token file.
func envToken() string {
	if t := strings.TrimSpace(os.Getenv("HF_TOKEN")); t != "" {
		return t
	}
	path := os.Getenv("HF_TOKEN_PATH")
	if path == "" {
		path = filepath.Join(hfHome(), "token")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return strings.TrimSpace(line)
}

// envTrue reads a boolean environment variable the way huggingface_hub
// does: 1, ON, YES and TRUE (any case) are true.
func envTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

func (c *Client) endpoint() string {
	if c.Endpoint == "" {
		return DefaultEndpoint
	}
	return strings.TrimRight(c.Endpoint, "/")
}

func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Ref is what `ferrite pull` takes: ORG/NAME[@REVISION][:QUANT].
type Ref struct {
	Repo     string // "ORG/NAME"
	Revision string // a branch, tag or commit; "main" when not given
	Quant    string // a GGUF quantization such as "Q4_K_M"; "" for safetensors
}

func (r Ref) String() string {
	s := r.Repo
	if r.Revision != "main" && r.Revision != "" {
		s += "@" + r.Revision
	}
	if r.Quant != "" {
		s += ":" + r.Quant
	}
	return s
}

var (
	repoPart   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)
	quantName  = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
)

// ParseRef reads ORG/NAME[@REVISION][:QUANT]. A Hugging Face URL
// (https://huggingface.co/ORG/NAME) is accepted too.
func ParseRef(s string) (Ref, error) {
	orig := s
	s = strings.TrimSpace(s)
	for _, p := range []string{"https://huggingface.co/", "http://huggingface.co/", "hf.co/", "huggingface.co/"} {
		s = strings.TrimPrefix(s, p)
	}
	var r Ref
	if rest, q, ok := strings.Cut(s, ":"); ok {
		s, r.Quant = rest, q
		if !quantName.MatchString(q) {
			return Ref{}, fmt.Errorf("%q: the quantization after ':' should look like Q4_K_M", orig)
		}
	}
	s, r.Revision, _ = strings.Cut(s, "@")
	if r.Revision == "" {
		r.Revision = "main"
	}
	if strings.Contains(r.Revision, "..") || strings.HasPrefix(r.Revision, "/") || strings.HasSuffix(r.Revision, "/") {
		return Ref{}, fmt.Errorf("%q: bad revision %q", orig, r.Revision)
	}
	org, name, ok := strings.Cut(s, "/")
	if !ok || !validRepoPart(org) || !validRepoPart(name) {
		return Ref{}, fmt.Errorf("%q: want ORG/NAME[@REVISION][:QUANT], e.g. Qwen/Qwen3-0.6B or unsloth/Qwen3-8B-GGUF:Q4_K_M", orig)
	}
	r.Repo = org + "/" + name
	return r, nil
}

// validRepoPart is one half of a repository id: letters, digits, '.',
// '_' and '-', without "--" or ".." (the Hub's own rule, which also keeps
// the cache's models--ORG--NAME folder names unambiguous).
func validRepoPart(s string) bool {
	return repoPart.MatchString(s) && !strings.Contains(s, "--") && !strings.Contains(s, "..") && len(s) <= 96
}

// repoFolder is the cache folder of a model repository.
func (c *Client) repoFolder(repo string) string {
	return filepath.Join(c.CacheDir, "models--"+strings.ReplaceAll(repo, "/", "--"))
}
