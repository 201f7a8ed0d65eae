package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/ferrite-llm/ferrite/internal/hub"
	"github.com/ferrite-llm/ferrite/internal/hub/hubtest"
	"github.com/ferrite-llm/ferrite/ui"
)

// pullEnv points the Hugging Face variables at a fake hub and a fresh
// cache, and returns the cache.
func pullEnv(t *testing.T, f *hubtest.Hub) string {
	cache := t.TempDir()
	t.Setenv("HF_ENDPOINT", f.URL)
	t.Setenv("HF_HUB_CACHE", cache)
	t.Setenv("HF_HOME", t.TempDir())
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_TOKEN_PATH", "")
	t.Setenv("HF_HUB_OFFLINE", "")
	return cache
}

func TestPullCommand(t *testing.T) {
	f := hubtest.New(t)
	const commit = "1111111111222222222233333333334444444444"
	f.Add("acme/Tiny", commit, map[string]string{
		"config.json":       `{"model_type": "qwen3"}`,
		"tokenizer.json":    `{}`,
		"model.safetensors": strings.Repeat("w", 4096),
		"README.md":         "not fetched",
	})
	cache := pullEnv(t, f)
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"pull", "acme/Tiny"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	snap := filepath.Join(cache, "models--acme--Tiny", "snapshots", commit)
	if out.String() != snap+"\n" {
		t.Fatalf("stdout %q, want the snapshot %s", out.String(), snap)
	}
	for _, want := range []string{"[1/3] config.json", "[3/3] model.safetensors", "3 files", "chat with it: ferrite --model acme/Tiny"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	// The chat's catalog finds it by name.
	e, err := (&chatModels{}).find("acme/Tiny")
	if err != nil || e.Dir != snap || e.Arch != "qwen3" {
		t.Fatalf("catalog: %+v, %v", e, err)
	}
	// Again: nothing to download.
	out.Reset()
	errb.Reset()
	if code := Main(context.Background(), []string{"pull", "--quiet", "acme/Tiny"}, nil, &out, &errb); code != 0 || errb.Len() != 0 || out.String() != snap+"\n" {
		t.Fatalf("quiet re-pull: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func TestPullCommandErrors(t *testing.T) {
	f := hubtest.New(t)
	pullEnv(t, f)
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"pull"}, 2, "want one model, ORG/NAME"},
		{[]string{"pull", "--bogus", "a/b"}, 2, "ferrite pull: flag provided but not defined"},
		{[]string{"pull", "not-a-repo"}, 2, "want ORG/NAME"},
		{[]string{"pull", "acme/Missing"}, 1, "no such model repository"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, nil, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.says) || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errb.String(), tc.code, tc.says)
		}
	}
}

func TestPullHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"pull", "--help"}, nil, &out, &errb); code != 0 || errb.Len() != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	for _, want := range []string{"usage: ferrite pull [--quiet] ORG/NAME[@REVISION][:QUANT]", "HF_HUB_OFFLINE", "--quiet"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	Main(context.Background(), []string{"--help"}, nil, &out, &errb)
	for _, want := range []string{"ferrite pull ORG/NAME", "--endpoint", "[[endpoints]]", "/pull"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("ferrite --help lacks %q", want)
		}
	}
}

func TestPlainProgressLines(t *testing.T) {
	var b bytes.Buffer
	now := time.Unix(0, 0)
	report := plainProgress(&b, func() time.Time { return now })
	p := hub.Progress{Repo: "a/b", Stage: "downloading", File: "model.safetensors", Index: 2, Files: 3, Done: 1 << 20, Total: 4 << 20, ETA: -1}
	report(p)
	now = now.Add(time.Second)
	p.Done = 2 << 20
	report(p) // too soon for another line
	q := p
	q.File, q.Index = "config.json", 1
	report(q) // another file starts
	report(p) // the first one again: no new line
	now = now.Add(plainInterval)
	p.Done, p.Speed, p.ETA = 3<<20, 1<<20, time.Second
	report(p)
	want := "[2/3] model.safetensors\n  1.0 MiB / 4.0 MiB (25%)\n[1/3] config.json\n  3.0 MiB / 4.0 MiB (75%) · 1.0 MiB/s · ETA 1s\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestPullViewShowsProgress(t *testing.T) {
	ref, _ := hub.ParseRef("acme/Tiny")
	m := &pullView{ref: ref, cancel: func() {}}
	m.bar.Width = 20
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(pullProgressMsg(hub.Progress{Stage: "downloading", File: "model.safetensors", Index: 2, Files: 3,
		Done: 512 << 20, Total: 2 << 30, Speed: 40 << 20, ETA: 38 * time.Second}))
	v := m.View()
	for _, want := range []string{"Pulling acme/Tiny · [2/3] model.safetensors", "25%", "512.0 MiB / 2.0 GiB", "40.0 MiB/s", "ETA 38s"} {
		if !strings.Contains(v, want) {
			t.Errorf("view lacks %q:\n%s", want, v)
		}
	}
	if _, cmd := m.Update(pullDoneMsg{}); cmd == nil || m.View() != "" {
		t.Error("the view does not quit when the pull ends")
	}
}

func TestChatPuller(t *testing.T) {
	f := hubtest.New(t)
	const commit = "1111111111222222222233333333334444444444"
	f.Add("acme/Tiny", commit, map[string]string{"config.json": `{"model_type": "qwen3"}`, "model.safetensors": "w"})
	pullEnv(t, f)
	var last ui.PullProgress
	res, err := chatPuller{}.Pull(context.Background(), "acme/Tiny", func(p ui.PullProgress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "acme/Tiny" || !strings.HasPrefix(res.Summary, "2 files, ") || last.Fraction != 1 {
		t.Fatalf("result %+v, last progress %+v", res, last)
	}
	res, err = chatPuller{}.Pull(context.Background(), "acme/Tiny@"+commit, func(ui.PullProgress) {})
	if err != nil || !strings.HasSuffix(res.Model, filepath.Join("snapshots", commit)) {
		t.Fatalf("a revision opens by its directory: %+v, %v", res, err)
	}
	if _, err := (chatPuller{}).Pull(context.Background(), "nonsense", func(ui.PullProgress) {}); err == nil {
		t.Fatal("a bad name was accepted")
	}
}
