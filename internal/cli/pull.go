package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/charmbracelet/bubbles/progress"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/hub"
	"github.com/ferrite-llm/ferrite/internal/units"
	"github.com/ferrite-llm/ferrite/ui"
)

// plainInterval is how often `ferrite pull` prints a progress line when
// stderr is not a terminal.
const plainInterval = 5 * time.Second

const pullUsage = `usage: ferrite pull [--quiet] ORG/NAME[@REVISION][:QUANT]
Downloads a Hugging Face model (configuration, tokenizer, chat template and
safetensors weights; for a GGUF repository, the files of quantization QUANT)
into the Hugging Face cache, where /models and --model find it, and prints
its snapshot directory. Honours HF_ENDPOINT, HF_TOKEN (else $HF_HOME/token),
HF_HUB_CACHE, HF_HOME and HF_HUB_OFFLINE. An interrupted pull resumes where
it stopped.

examples:
  ferrite pull Qwen/Qwen3-0.6B
  ferrite pull Qwen/Qwen3-0.6B@main
  ferrite pull unsloth/Qwen3-8B-GGUF:Q4_K_M

flags:
`

// cmdPull implements `ferrite pull ORG/NAME[@REVISION][:QUANT]`: the
// model's files into the Hugging Face cache, with a progress bar on a
// terminal and a line every few seconds otherwise.
func cmdPull(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pull", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	quiet := fs.Bool("quiet", false, "no progress, only errors and the snapshot directory")
	if code, ok := parseFlags(fs, args, usageAndFlags(pullUsage, fs), stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "ferrite pull: want one model, ORG/NAME[@REVISION][:QUANT] (ferrite pull --help says more)\n")
		return 2
	}
	ref, err := hub.ParseRef(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "ferrite pull: %v\n", err)
		return 2
	}
	c := hub.FromEnv()
	var res hub.Result
	switch {
	case *quiet:
		res, err = c.Pull(ctx, ref, nil)
	case isTerminal(stderr):
		res, err = pullWithBar(ctx, c, ref, stderr)
	default:
		res, err = c.Pull(ctx, ref, plainProgress(stderr, time.Now))
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			err = errors.New("interrupted; run it again to resume")
		}
		fmt.Fprintf(stderr, "ferrite pull %s: %v\n", ref, err)
		return 1
	}
	if !*quiet {
		fmt.Fprint(stderr, pullSummary(ref, res))
	}
	fmt.Fprintln(stdout, res.Dir)
	return 0
}

// pullSummary says what was pulled and how to open it.
func pullSummary(ref hub.Ref, res hub.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (commit %s): %s\n", ref, res.Commit[:12], pullLine(res))
	if res.GGUF {
		file := pulledGGUF(res)
		if e, err := catalog.Probe(file); err != nil {
			fmt.Fprintf(&b, "warning: %v\n", err)
		} else if e.Problem != "" {
			fmt.Fprintf(&b, "warning: %s\n", e.Problem)
		}
		fmt.Fprintf(&b, "chat with it: ferrite --model %s\n", file)
		return b.String()
	}
	e, err := catalog.Probe(res.Dir)
	switch {
	case err != nil:
		fmt.Fprintf(&b, "warning: %v\n", err)
	case e.Problem != "":
		fmt.Fprintf(&b, "warning: %s\n", e.Problem)
	}
	fmt.Fprintf(&b, "chat with it: ferrite --model %s", pulledModel(ref, res))
	if ref.Revision == "main" {
		fmt.Fprintf(&b, "   (or /model %s in the chat)", ref.Repo)
	}
	b.WriteString("\n")
	return b.String()
}

// pullLine is the files and bytes of a pull, and how many were downloaded.
func pullLine(res hub.Result) string {
	how := fmt.Sprintf("%s downloaded", units.Bytes(res.Downloaded))
	switch {
	case res.Offline:
		how = "offline: found in the cache"
	case res.Downloaded == 0:
		how = "all in the cache already"
	}
	return fmt.Sprintf("%d files, %s (%s)", len(res.Files), units.Bytes(res.Size), how)
}

// pulledModel is what --model and /model take to open a pulled model:
// its name for the revision the catalog lists (main), else its snapshot
// directory.
func pulledModel(ref hub.Ref, res hub.Result) string {
	if ref.Revision == "main" {
		return ref.Repo
	}
	return res.Dir
}

// pulledGGUF is the GGUF file of a pulled GGUF model (the first part of a
// split one), which --model and /model take.
func pulledGGUF(res hub.Result) string { return filepath.Join(res.Dir, res.Files[0]) }

// chatPuller is the chat's ui.Puller: internal/hub configured from the
// environment, like `ferrite pull`.
type chatPuller struct{}

// Pull implements ui.Puller.
func (chatPuller) Pull(ctx context.Context, name string, progress func(ui.PullProgress)) (ui.PullResult, error) {
	ref, err := hub.ParseRef(name)
	if err != nil {
		return ui.PullResult{}, err
	}
	res, err := hub.FromEnv().Pull(ctx, ref, func(p hub.Progress) {
		text := p.Rate()
		if text == "" {
			text = p.Stage
		}
		progress(ui.PullProgress{Fraction: p.Fraction(), Text: text})
	})
	if err != nil {
		return ui.PullResult{}, err
	}
	out := ui.PullResult{Summary: pullLine(res) + ".", Model: pulledModel(ref, res)}
	if res.GGUF {
		out.Model = pulledGGUF(res)
	}
	return out, nil
}

// plainProgress prints a line when a file starts (files download several
// at once) and a progress line every plainInterval.
func plainProgress(w io.Writer, now func() time.Time) func(hub.Progress) {
	var last time.Time
	started := map[string]bool{}
	return func(p hub.Progress) {
		if p.Stage == "done" {
			return
		}
		if p.File != "" && !started[p.File] {
			started[p.File] = true
			fmt.Fprintf(w, "[%d/%d] %s\n", p.Index, p.Files, p.File)
		}
		if t := now(); t.Sub(last) >= plainInterval && p.Total > 0 && p.Stage == "downloading" {
			last = t
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
}

// pullWithBar runs the pull under a small bubbletea program: the pull in
// a goroutine sends its progress with Program.Send, Update only stores it.
func pullWithBar(ctx context.Context, c *hub.Client, ref hub.Ref, stderr io.Writer) (hub.Result, error) {
	// Ctrl+C in the program cancels only the pull, which then ends the
	// program with its last message; ctx ending (a signal) kills both.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := &pullView{ref: ref, bar: progress.New(progress.WithDefaultGradient()), cancel: cancel}
	p := tea.NewProgram(m, tea.WithOutput(stderr), tea.WithContext(ctx))
	done := make(chan pullDoneMsg, 1)
	go func() {
		res, err := c.Pull(pctx, ref, func(pr hub.Progress) { p.Send(pullProgressMsg(pr)) })
		done <- pullDoneMsg{res, err}
		p.Send(pullDoneMsg{res, err})
	}()
	if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) {
		cancel()
		<-done
		return hub.Result{}, err
	}
	cancel()
	d := <-done
	return d.res, d.err
}

type (
	pullProgressMsg hub.Progress
	pullDoneMsg     struct {
		res hub.Result
		err error
	}
)

// pullView is the terminal progress of `ferrite pull`: the file being
// fetched, a bar, and size, speed and ETA.
type pullView struct {
	ref    hub.Ref
	bar    progress.Model
	state  hub.Progress
	width  int
	cancel context.CancelFunc
	ended  bool
}

func (m *pullView) Init() tea.Cmd { return nil }

func (m *pullView) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width = msg.Width
		m.bar.Width = max(min(msg.Width-4, 60), 10)
	case tea.KeyMsg:
		if msg.Type == tea.KeyCtrlC || msg.String() == "q" {
			m.cancel() // the pull ends with ctx's error, then pullDoneMsg quits
		}
	case pullProgressMsg:
		m.state = hub.Progress(msg)
	case pullDoneMsg:
		m.ended = true
		return m, tea.Quit
	}
	return m, nil
}

func (m *pullView) View() string {
	if m.ended {
		return ""
	}
	s := m.state
	head := fmt.Sprintf("Pulling %s · %s", m.ref, s.Stage)
	if s.File != "" {
		head = fmt.Sprintf("Pulling %s · [%d/%d] %s", m.ref, s.Index, s.Files, s.File)
	}
	if m.width > 0 && len([]rune(head)) > m.width {
		head = string([]rune(head)[:m.width-1]) + "…"
	}
	line := ""
	if s.Total > 0 {
		line = "\n" + m.bar.ViewAs(s.Fraction()) + "\n" + s.String()
	}
	return head + line + "\n"
}
