package ui

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/adrg/xdg"
)

// DefaultChatsDir is where chats are saved: $XDG_DATA_HOME/ferrite/chats
// (~/.local/share/ferrite/chats when XDG_DATA_HOME is unset).
func DefaultChatsDir() string {
	return filepath.Join(xdg.DataHome, "ferrite", "chats")
}

// store saves chats as <name>.json files in one directory. Saves run in
// commands, possibly several at once: each carries a sequence number taken
// in Update, and a save older than the last one written to the same file is
// dropped, so a slow save never overwrites a newer one.
type store struct {
	dir string

	mu      sync.Mutex
	written map[string]uint64 // file -> sequence number of the last save written
}

func newStore(dir string) *store {
	return &store{dir: dir, written: map[string]uint64{}}
}

// chatNameRE is what /save and /load accept as a name, and what chat ids
// look like: a file name without directories or a leading dot.
var chatNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)

func checkChatName(name string) error {
	if !chatNameRE.MatchString(name) {
		return fmt.Errorf("%q is not a valid chat name: use up to 64 letters, digits, '.', '_' or '-'", name)
	}
	return nil
}

// path is the file of chat name.
func (s *store) path(name string) string { return filepath.Join(s.dir, name+".json") }

// save writes c as <name>.json unless a newer save (higher seq) has
// already been written there.
func (s *store) save(name string, c *Chat, seq uint64) (string, error) {
	if err := checkChatName(name); err != nil {
		return "", err
	}
	data, err := MarshalChat(c)
	if err != nil {
		return "", err
	}
	path := s.path(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq < s.written[path] {
		return path, nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return "", err
	}
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		return "", err
	}
	s.written[path] = seq
	return path, nil
}

// load reads <name>.json.
func (s *store) load(name string) (*Chat, error) {
	if err := checkChatName(name); err != nil {
		return nil, err
	}
	c, err := readChatFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no saved chat %q in %s", name, s.dir)
	}
	return c, err
}

// readChatFile reads a chat saved, or exported as JSON, at path.
func readChatFile(path string) (*Chat, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := UnmarshalChat(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// isChatPath says whether what /load was given is a file's path rather
// than a saved chat's name: it has a directory, starts with ~ or ends
// with .json.
func isChatPath(arg string) bool {
	return strings.ContainsRune(arg, filepath.Separator) || strings.ContainsRune(arg, '/') ||
		strings.HasPrefix(arg, "~") || strings.HasSuffix(arg, ".json")
}

// savedChat is one entry of list.
type savedChat struct {
	Name    string
	ModTime time.Time
}

// list returns the saved chats, most recent first.
func (s *store) list() ([]savedChat, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []savedChat
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || checkChatName(name) != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, savedChat{Name: name, ModTime: info.ModTime()})
	}
	slices.SortFunc(out, func(a, b savedChat) int { return b.ModTime.Compare(a.ModTime) })
	return out, nil
}

// writeFileAtomic replaces path with data so that a reader (or a crash)
// sees either the old file or the new one whole: it writes a temporary
// file in the same directory, syncs it, renames it over path and syncs the
// directory.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable once the directory is synced; not every
	// platform can sync a directory, and the file is complete either way.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
