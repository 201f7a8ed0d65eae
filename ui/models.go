package ui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/ferrite-llm/ferrite/internal/units"
)

// Switching models. /model NAME asks Models.Find in a command, then loads
// the model in another; the load reports its stages through a channel
// that a self-re-issuing command reads (like a reply's events), and the
// status bar shows them with the time so far. The chat stays usable: new
// replies go to the current engine until the new one is ready. Then it
// takes over: replies still running on the old engine finish there, and
// the old engine is closed (in a command) once none is left. A load that
// fails leaves everything as it was and says why.

func (m *model) cmdModels(string) tea.Cmd { return m.listModelsCmd(true) }

func (m *model) cmdModel(args string) tea.Cmd {
	if args == "" {
		return m.listModelsCmd(true)
	}
	if m.opts.Models == nil {
		m.view.notice(entryWarning, "This chat cannot switch models: it was started without a model catalog.")
		return nil
	}
	if l := m.loading; l != nil {
		m.view.notice(entryWarning, fmt.Sprintf("%s is still loading: wait for it before loading another model.", l.entry.Name))
		return nil
	}
	if e, ok := m.listedModel(args); ok {
		return func() tea.Msg { return modelFoundMsg{name: args, entry: e} }
	}
	models := m.opts.Models
	return func() (msg tea.Msg) {
		defer func() {
			if r := recover(); r != nil {
				msg = modelFoundMsg{name: args, err: fmt.Errorf("panic: %v", r)}
			}
		}()
		e, err := models.Find(context.Background(), args)
		return modelFoundMsg{name: args, entry: e, err: err}
	}
}

// listedModel is entry N of the list /models shows, for a number N that
// is not also a model's name.
func (m *model) listedModel(arg string) (ModelEntry, bool) {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 || n > len(m.modelList) ||
		slices.ContainsFunc(m.modelList, func(e ModelEntry) bool { return e.Name == arg }) {
		return ModelEntry{}, false
	}
	return m.modelList[n-1], true
}

// withOpened is list and, after it, the models the chat has run that it
// lacks (a model opened by its folder, outside the catalog's places).
func (m *model) withOpened(list []ModelEntry) []ModelEntry {
	out := slices.Clip(list)
	for _, e := range m.opened {
		if !slices.ContainsFunc(out, func(x ModelEntry) bool { return sameModel(x, e) }) {
			out = append(out, e)
		}
	}
	return out
}

// listModelsCmd asks Models.List; show says to print the list.
func (m *model) listModelsCmd(show bool) tea.Cmd {
	models := m.opts.Models
	if models == nil {
		if show {
			return func() tea.Msg { return modelsListedMsg{show: true} }
		}
		return nil
	}
	return func() (msg tea.Msg) {
		defer func() {
			if r := recover(); r != nil {
				msg = modelsListedMsg{show: show, err: fmt.Errorf("panic: %v", r)}
			}
		}()
		list, err := models.List(context.Background())
		return modelsListedMsg{entries: list, err: err, show: show}
	}
}

func (m *model) onModelsListed(msg modelsListedMsg) {
	msg.entries = m.withOpened(msg.entries)
	if msg.err == nil {
		m.modelList = msg.entries
	}
	if !msg.show {
		return
	}
	if msg.err != nil {
		m.view.notice(entryError, "listing models failed: "+msg.err.Error())
	}
	var b strings.Builder
	cur := m.cur.entry
	fmt.Fprintf(&b, "Using %s", m.info.Name)
	if m.info.Arch != "" {
		fmt.Fprintf(&b, " (%s)", m.info.Arch)
	}
	if m.opts.Models == nil {
		b.WriteString(". No other models: this chat was started without a model catalog.")
		m.view.notice(entryNotice, b.String())
		return
	}
	if len(msg.entries) <= 1 && (len(msg.entries) == 0 || sameModel(msg.entries[0], cur)) {
		b.WriteString(". No other models were found: see /help for where ferrite looks.")
		m.view.notice(entryNotice, b.String())
		return
	}
	b.WriteString(". Models (/model NAME or NUMBER switches):")
	nameW, archW := 0, 0
	for _, e := range msg.entries {
		nameW, archW = max(nameW, len([]rune(e.Name))), max(archW, len(e.Arch))
	}
	nameW, archW = min(nameW, 40), min(archW, 16)
	for i, e := range msg.entries {
		mark := " "
		if sameModel(e, cur) {
			mark = "●"
		}
		size := "?"
		if e.Size > 0 {
			size = formatBytes(e.Size)
		}
		arch := e.Arch
		if arch == "" {
			arch = "?"
		}
		fmt.Fprintf(&b, "\n%2d %s %-*s  %-*s  %9s  %s", i+1, mark, nameW, e.Name, archW, arch, size, e.Source)
		if e.Quant != "" {
			b.WriteString(" · " + e.Quant)
		}
		if e.Path != "" && e.Source != "hf-cache" {
			b.WriteString("  " + units.ShortPath(e.Path))
		}
		if e.Problem != "" {
			b.WriteString("  ⚠ " + e.Problem)
		}
	}
	m.view.notice(entryNotice, b.String())
}

// sameModel reports whether a and b are the same model.
func sameModel(a, b ModelEntry) bool {
	if a.Path != "" || b.Path != "" {
		return a.Path == b.Path
	}
	return a.Name == b.Name
}

func (m *model) onModelFound(msg modelFoundMsg) tea.Cmd {
	if msg.err != nil {
		m.view.notice(entryWarning, "/model "+msg.name+": "+msg.err.Error())
		return nil
	}
	if sameModel(msg.entry, m.cur.entry) && !m.cur.unloaded {
		m.view.notice(entryNotice, "Already using "+msg.entry.Name+".")
		return nil
	}
	if m.loading != nil {
		return nil // another /model got there first
	}
	return m.startLoad(msg.entry)
}

// startLoad loads e in a command, with its progress read by another. A
// model on a GPU (ModelInfo.DeviceMemory) asks the load to keep to the
// device: one that does not fit beside it comes back with ErrNoRoom, and
// onModelLoaded makes room (makeRoom).
func (m *model) startLoad(e ModelEntry) tea.Cmd {
	keep := m.canUnload()
	models := m.opts.Models
	return m.beginLoad(e, func(ctx context.Context, report func(string)) modelLoadedMsg {
		eng, closer, err := models.Load(ctx, e, LoadOptions{KeepDevice: keep}, report)
		return modelLoadedMsg{entry: e, eng: eng, closer: closer, err: err, keep: keep}
	})
}

// beginLoad runs load in a command as the model loading (m.loading), with
// its progress read by another.
func (m *model) beginLoad(e ModelEntry, load func(ctx context.Context, report func(string)) modelLoadedMsg) tea.Cmd {
	m.loadSeq++
	ctx, cancel := context.WithCancel(context.Background())
	p := newProgress[string](8)
	m.loading = &loadState{id: m.loadSeq, entry: e, stage: "starting", started: m.now(), cancel: cancel, progress: p.ch}
	id := m.loadSeq
	run := func() (msg tea.Msg) {
		defer p.close()
		defer func() {
			if r := recover(); r != nil {
				msg = modelLoadedMsg{id: id, entry: e, err: panicError(r)}
			}
		}()
		lm := load(ctx, p.report)
		lm.id = id
		return lm
	}
	return tea.Batch(run, waitProgress(id, p.ch), m.startTicking())
}

// canUnload reports whether the current model holds a GPU's memory that
// the chat can give back by closing it.
func (m *model) canUnload() bool {
	c := m.cur
	return c.info.DeviceMemory && c.closer != nil && !c.closed
}

// makeRoom follows a load that kept to the device and found no room
// (ErrNoRoom): the current model, once idle, is unloaded and e loaded
// again (loadAfterUnload); with replies running on it, the user is told
// how to make room.
func (m *model) makeRoom(e ModelEntry, err error) tea.Cmd {
	old := m.cur
	why := strings.TrimPrefix(err.Error(), ErrNoRoom.Error()+": ")
	if old.active > 0 {
		m.view.notice(entryWarning, fmt.Sprintf("%s does not fit beside %s (%s). Stop %s's replies (esc), then /model %s again: it is unloaded first. Still using %s.",
			e.Name, old.info.Name, why, old.info.Name, e.Name, old.info.Name))
		return nil
	}
	m.view.notice(entryNotice, fmt.Sprintf("%s does not fit beside %s (%s): unloading %s to make room.", e.Name, old.info.Name, why, old.info.Name))
	old.unloaded, old.retired, old.closed = true, true, true
	m.engines = slices.DeleteFunc(m.engines, func(x *engineRef) bool { return x == old })
	return m.loadAfterUnload(e, old)
}

// loadAfterUnload closes old, then loads e; where e fails (but not
// because the chat quits), it loads old's model again.
func (m *model) loadAfterUnload(e ModelEntry, old *engineRef) tea.Cmd {
	models := m.opts.Models
	return m.beginLoad(e, func(ctx context.Context, report func(string)) modelLoadedMsg {
		report("unloading " + old.info.Name)
		if err := old.closer.Close(); err != nil {
			report("unloading " + old.info.Name + " failed: " + err.Error())
		}
		msg := modelLoadedMsg{entry: e, freed: old}
		msg.eng, msg.closer, msg.err = models.Load(ctx, e, LoadOptions{}, report)
		switch {
		case msg.err == nil:
		case ctx.Err() != nil: // the chat is quitting
			msg.backErr = ctx.Err()
		default:
			report("loading " + old.info.Name + " again")
			msg.back, msg.backCloser, msg.backErr = models.Load(ctx, old.entry, LoadOptions{}, report)
		}
		return msg
	})
}

// engineGone says why no reply can start now (the model was unloaded to
// make room for another), or "" when one can.
func (m *model) engineGone() string {
	if !m.cur.unloaded {
		return ""
	}
	if l := m.loading; l != nil {
		return fmt.Sprintf("%s was unloaded to make room: wait for %s to load", m.cur.info.Name, l.entry.Name)
	}
	return "no model is loaded: /model NAME opens one"
}

// waitProgress reads the next stage; it ends (a nil message) once the
// load is over.
func waitProgress(id int, ch <-chan string) tea.Cmd {
	return receive(ch, func(s string) tea.Msg { return loadProgressMsg{id: id, stage: s} })
}

// receive is a command that waits for ch's next value and returns msg of
// it, or nil once ch is closed: the self-re-issuing pull of a progress
// channel (the message's handler issues it again).
func receive[T any](ch <-chan T, msg func(T) tea.Msg) tea.Cmd {
	return func() tea.Msg {
		v, ok := <-ch
		if !ok {
			return nil
		}
		return msg(v)
	}
}

func (m *model) onLoadProgress(msg loadProgressMsg) tea.Cmd {
	l := m.loading
	if l == nil || l.id != msg.id {
		return nil
	}
	l.stage = msg.stage
	return waitProgress(l.id, l.progress)
}

func (m *model) onModelLoaded(msg modelLoadedMsg) tea.Cmd {
	l := m.loading
	if l == nil || l.id != msg.id {
		return closeEngineCmd(msg.entry.Name, msg.closer) // cannot happen: one load at a time
	}
	m.loading = nil
	l.cancel()
	if msg.err != nil {
		if msg.keep && errors.Is(msg.err, ErrNoRoom) {
			return m.makeRoom(msg.entry, msg.err)
		}
		m.logger().Error("model load failed", "model", msg.entry.Name, "err", msg.err)
		if msg.freed != nil {
			return m.onLoadBack(msg)
		}
		m.view.notice(entryError, fmt.Sprintf("Could not load %s: %v. Still using %s.%s", msg.entry.Name, msg.err, m.info.Name, m.logHint()))
		return nil
	}
	old := m.cur
	m.use(msg.eng, msg.closer, msg.entry)
	if !slices.ContainsFunc(m.opened, func(e ModelEntry) bool { return sameModel(e, m.cur.entry) }) {
		m.opened = append(m.opened, m.cur.entry)
	}
	if !slices.ContainsFunc(m.modelList, func(e ModelEntry) bool { return sameModel(e, m.cur.entry) }) {
		m.modelList = append(m.modelList, m.cur.entry)
	}
	// The new model's recommended sampling, where a chat still has the
	// previous model's.
	var samplingNote string
	if f := m.opts.SamplingFor; f != nil {
		before, after := f(old.info.Sampling), f(m.info.Sampling)
		for _, t := range m.tabs {
			prev := t.chat.Settings
			if t.chat.Settings.followRecommendation(before, after) && t == m.chatTab {
				samplingNote = SamplingNote(m.info.Name, prev, t.chat.Settings)
			}
		}
	}
	for _, t := range m.tabs {
		t.chat.Model = m.info
		t.view.modelName = m.info.Name
		t.view.dirty = true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Switched to %s", m.info.Name)
	if m.info.Arch != "" {
		fmt.Fprintf(&b, " (%s", m.info.Arch)
		if m.info.MaxContext > 0 {
			fmt.Fprintf(&b, ", context %d tokens", m.info.MaxContext)
			if m.info.KVLimited {
				b.WriteString(" by the KV budget")
			}
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, " in %.1fs.", m.now().Sub(l.started).Seconds())
	if msg.freed != nil {
		fmt.Fprintf(&b, " %s was unloaded to make room.", msg.freed.info.Name)
	}
	if m.info.Draft > 0 {
		fmt.Fprintf(&b, " MTP speculative decoding is on (%d draft tokens).", m.info.Draft)
	}
	old.retired = true
	if old.active > 0 {
		fmt.Fprintf(&b, " %s finishes the %d replies in progress (esc stops them), then it is closed.", old.info.Name, old.active)
	}
	m.view.notice(entryNotice, b.String())
	if samplingNote != "" {
		m.view.notice(entryNotice, samplingNote)
	}
	return tea.Batch(m.maybeClose(old), m.fetchStats())
}

// onLoadBack follows a model that failed to load after the current one
// was unloaded for it: the current one's model is in use again if it
// loaded back, else the chat has none until /model opens one.
func (m *model) onLoadBack(msg modelLoadedMsg) tea.Cmd {
	old := msg.freed
	if msg.backErr != nil {
		m.logger().Error("model reload failed", "model", old.info.Name, "err", msg.backErr)
		m.view.notice(entryError, fmt.Sprintf("Could not load %s: %v. Loading %s again failed too: %v. /model NAME opens a model.%s",
			msg.entry.Name, msg.err, old.info.Name, msg.backErr, m.logHint()))
		return nil
	}
	m.use(msg.back, msg.backCloser, old.entry)
	m.view.notice(entryError, fmt.Sprintf("Could not load %s: %v. %s is loaded again and in use.%s", msg.entry.Name, msg.err, old.info.Name, m.logHint()))
	return m.fetchStats()
}

// use makes eng (of entry e, closed by closer) the current engine, one of
// the chat's.
func (m *model) use(eng Engine, closer io.Closer, e ModelEntry) {
	m.cur = &engineRef{eng: eng, info: eng.Info(), entry: e, closer: closer}
	m.engines = append(m.engines, m.cur)
	m.info = m.cur.info
	if m.cur.entry.Name == "" {
		m.cur.entry.Name = m.info.Name
	}
}

// maybeClose closes e once another model has taken over and no reply
// runs on it.
func (m *model) maybeClose(e *engineRef) tea.Cmd {
	if !e.retired || e.active > 0 || e.closed {
		return nil
	}
	e.closed = true
	for i, x := range m.engines {
		if x == e {
			m.engines = append(m.engines[:i], m.engines[i+1:]...)
			break
		}
	}
	return closeEngineCmd(e.info.Name, e.closer)
}

// closeEngineCmd closes an engine in a command (a runtime waits for its
// step in progress).
func closeEngineCmd(name string, c io.Closer) tea.Cmd {
	if c == nil {
		return nil
	}
	return func() tea.Msg { return engineClosedMsg{name: name, err: c.Close()} }
}

// completeModels lists the known models whose name contains arg. A
// number is the model at that position of /models, as Models.Find reads
// it: the popup shows that one entry (unless a model has the number for
// its name), not the names that contain the digits.
func (m *model) completeModels(arg string) []compItem {
	if n, err := strconv.Atoi(arg); err == nil && n >= 1 && n <= len(m.modelList) &&
		!slices.ContainsFunc(m.modelList, func(e ModelEntry) bool { return e.Name == arg }) {
		e := m.modelList[n-1]
		return []compItem{{value: arg, label: arg + " " + e.Name, desc: modelDesc(e), keep: true}}
	}
	var out []compItem
	low := strings.ToLower(arg)
	for _, e := range m.modelList {
		if strings.Contains(strings.ToLower(e.Name), low) {
			out = append(out, compItem{value: e.Name, label: e.Name, desc: modelDesc(e)})
		}
	}
	return out
}

// modelDesc describes a model in the completion popup.
func modelDesc(e ModelEntry) string {
	desc := e.Source
	if e.Arch != "" {
		desc = e.Arch + " · " + desc
	}
	if e.Size > 0 {
		desc += " · " + formatBytes(e.Size)
	}
	return desc
}
