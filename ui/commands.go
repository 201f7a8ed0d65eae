package ui

import (
	"fmt"
	"slices"
	"strings"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/ferrite-llm/ferrite/internal/settings"
)

// command is one slash command.
type command struct {
	name string
	args string // usage of the arguments, e.g. "md|json [path]"
	desc string
	// run executes the command with the text after its name (trimmed).
	run func(m *model, args string) tea.Cmd
	// complete lists completions of the first argument (may be nil).
	complete func(m *model, arg string) []compItem
}

// commandSet is the chat's slash commands, in the order /help lists them.
type commandSet struct {
	list []command
}

func newCommandSet() *commandSet {
	return &commandSet{list: []command{
		{name: "help", desc: "list commands and keys", run: (*model).cmdHelp},
		{name: "model", args: "[name|N|dir]", desc: "switch model (loads while you chat); list them without a name", run: (*model).cmdModel, complete: (*model).completeModels},
		{name: "models", desc: "list the models: built-in, config, Hugging Face cache, ferrite's folder", run: (*model).cmdModels},
		{name: "new", desc: "open a new chat (ctrl+n); the others stay open", run: (*model).cmdNew},
		{name: "chats", desc: "list the open chats", run: (*model).cmdChats},
		{name: "switch", args: "N", desc: "show open chat N (ctrl+←/→ cycle)", run: (*model).cmdSwitch},
		{name: "close", args: "[N]", desc: "close this chat (or chat N); it stays saved", run: (*model).cmdClose},
		{name: "clear", desc: "clear this chat's messages", run: (*model).cmdClear},
		{name: "system", args: "[text|--clear]", desc: "show or set the system prompt", run: (*model).cmdSystem},
		{name: "set", args: "[name value]", desc: "show or change a sampling or MTP setting", run: (*model).cmdSet, complete: completeParams},
		{name: "regen", args: "[N]", desc: "N alternative replies to the last message, generated at once, to compare", run: (*model).cmdRegen},
		{name: "pick", args: "[N]", desc: "keep alternative N of /regen (0: the previous reply)", run: (*model).cmdPick},
		{name: "stop", desc: "stop the replies being generated in this chat", run: (*model).cmdStop},
		{name: "stats", desc: "engine and last-reply statistics", run: (*model).cmdStats},
		{name: "export", args: "md|json [path]", desc: "export the chat as Markdown or JSON", run: (*model).cmdExport, complete: completeExport},
		{name: "copy", desc: "copy the last reply to the clipboard (OSC 52)", run: (*model).cmdCopy},
		{name: "save", args: "name", desc: "save the chat under a name", run: (*model).cmdSave},
		{name: "load", args: "[name|file.json]", desc: "load a saved chat, or a chat exported as JSON; list them without a name", run: (*model).cmdLoad},
		{name: "quit", desc: "leave ferrite", run: (*model).cmdQuit},
	}}
}

func (s *commandSet) lookup(name string) (command, bool) {
	i := slices.IndexFunc(s.list, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return s.list[i], true
}

// complete lists completions of a single-line input starting with "/": the
// commands whose name starts with what was typed, or, after a command name
// and a space, its argument's completions.
func (s *commandSet) complete(value string, m *model) []compItem {
	word, rest, hasArg := strings.Cut(strings.TrimPrefix(value, "/"), " ")
	if !hasArg {
		var out []compItem
		for _, c := range s.list {
			if strings.HasPrefix(c.name, word) {
				v := "/" + c.name
				if c.args != "" {
					v += " "
				}
				out = append(out, compItem{value: v, label: "/" + c.name, args: c.args, desc: c.desc})
			}
		}
		return out
	}
	c, ok := s.lookup(word)
	if !ok || c.complete == nil || strings.Contains(rest, " ") {
		return nil
	}
	items := c.complete(m, rest)
	for i := range items {
		items[i].value = "/" + c.name + " " + items[i].value
	}
	return items
}

// defaultDraft is the draft length /set mtp on picks when neither the
// chat nor the engine has one (settings.Table's default).
var defaultDraft = settings.Default().MTP.Draft

// setNames are the settings /set changes: those of settings.Table with a
// /set name.
func setNames() []string { return settings.ChatNames() }

func paramNames() string { return strings.Join(setNames(), ", ") }

// setRanges lists the /set names with the values each takes.
func setRanges() string {
	names := setNames()
	for i, name := range names {
		names[i] = name + " (" + settings.ByChat(name).Values() + ")"
	}
	return strings.Join(names, ", ")
}

// applySetting parses "/set name value" arguments into s, for a model
// with info: the value is read and checked by the setting's row of
// settings.Table.
func applySetting(s *Settings, args string, info ModelInfo) (name string, err error) {
	f := strings.Fields(args)
	if len(f) != 2 {
		return "", fmt.Errorf("usage: /set <name> <value>, with name one of %s", paramNames())
	}
	row := settings.ByChat(f[0])
	if row == nil || s.field(f[0]) == nil {
		return "", fmt.Errorf("unknown setting %q: use one of %s", f[0], paramNames())
	}
	v, err := row.Parse(f[1])
	if err != nil {
		return "", fmt.Errorf("%s: %w", f[0], err)
	}
	switch {
	case (f[0] == "draft" || v == "on") && !info.MTP:
		return "", fmt.Errorf("%s: %s has no MTP module", f[0], info.Name)
	case f[0] == "draft" && s.MTP == "":
		// The mode was the engine's: name it, so that a draft length does
		// not turn speculation on or off by itself.
		s.MTP = s.mtpMode(info)
	}
	s.set(f[0], v)
	return f[0], nil
}

func completeParams(_ *model, arg string) []compItem {
	var out []compItem
	for _, name := range setNames() {
		if strings.HasPrefix(name, arg) {
			row := settings.ByChat(name)
			out = append(out, compItem{value: name + " ", label: name, desc: row.Help + " (" + row.Values() + ")"})
		}
	}
	return out
}

func completeExport(_ *model, arg string) []compItem {
	var out []compItem
	for _, f := range []compItem{
		{value: "md ", label: "md", args: "[path]", desc: "Markdown: roles, times, settings, per-reply stats"},
		{value: "json ", label: "json", args: "[path]", desc: "JSON: the whole chat, loadable with /load"},
	} {
		if strings.HasPrefix(f.label, arg) {
			out = append(out, f)
		}
	}
	return out
}

// Help lists the chat's slash commands and keys, as /help shows them
// (for ferrite --help).
func Help() string { return helpText(newCommandSet(), DefaultKeyMap()) }

// helpText is what /help shows.
func (m *model) helpText() string { return helpText(m.cmds, m.keys) }

func helpText(cmds *commandSet, keys KeyMap) string {
	var b strings.Builder
	b.WriteString("Commands:\n")
	w := 0
	for _, c := range cmds.list {
		w = max(w, len(c.name)+1+len(c.args))
	}
	for _, c := range cmds.list {
		head := "/" + c.name
		if c.args != "" {
			head += " " + c.args
		}
		fmt.Fprintf(&b, "  %-*s  %s\n", w+1, head, c.desc)
	}
	fmt.Fprintf(&b, "\n/set names: %s\n", paramNames())
	b.WriteString("\nKeys:\n")
	for _, g := range keys.helpGroups() {
		parts := make([]string, 0, len(g))
		for _, k := range g {
			h := k.Help()
			parts = append(parts, h.Key+" "+h.Desc)
		}
		b.WriteString("  " + strings.Join(parts, " · ") + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}
