package ui

import (
	"strings"

	"github.com/charmbracelet/bubbles/key"
)

// KeyMap is every key the chat handles. The input's editing keys (cursor
// movement, word deletion, …) are the textarea's defaults, except for
// InsertNewline, which is Input.Newline here.
type KeyMap struct {
	Input struct {
		Send    key.Binding // send the message (or run the slash command)
		Newline key.Binding // insert a newline
		HistPrv key.Binding // previous input (when the input is empty or the cursor is on its first line)
		HistNxt key.Binding // next input (cursor on the last line)
	}
	Chat struct {
		PageUp   key.Binding
		PageDown key.Binding
		LineUp   key.Binding
		LineDown key.Binding
		Top      key.Binding
		Bottom   key.Binding
		Thinking key.Binding // show or hide <think> blocks
		Mouse    key.Binding // release the mouse so the terminal can select text
	}
	Chats struct { // several chats open at once
		New  key.Binding
		Prev key.Binding
		Next key.Binding
	}
	Choice struct { // the alternatives of /regen
		Prev key.Binding
		Next key.Binding
		Keep key.Binding // on an empty input: keep the alternative shown
	}
	Complete struct {
		Next   key.Binding
		Prev   key.Binding
		Accept key.Binding
		Close  key.Binding
	}
	Stop key.Binding // stop the reply being generated
	Quit key.Binding // stop the reply; quit on a second press
}

// DefaultKeyMap is the chat's key map.
func DefaultKeyMap() KeyMap {
	var k KeyMap
	k.Input.Send = key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "send"))
	k.Input.Newline = key.NewBinding(key.WithKeys("alt+enter", "ctrl+j"), key.WithHelp("alt+enter/ctrl+j", "newline"))
	k.Input.HistPrv = key.NewBinding(key.WithKeys("up"), key.WithHelp("↑", "previous input"))
	k.Input.HistNxt = key.NewBinding(key.WithKeys("down"), key.WithHelp("↓", "next input"))

	k.Chat.PageUp = key.NewBinding(key.WithKeys("pgup"), key.WithHelp("pgup", "scroll up"))
	k.Chat.PageDown = key.NewBinding(key.WithKeys("pgdown"), key.WithHelp("pgdn", "scroll down"))
	k.Chat.LineUp = key.NewBinding(key.WithKeys("shift+up"), key.WithHelp("shift+↑", "scroll a line up"))
	k.Chat.LineDown = key.NewBinding(key.WithKeys("shift+down"), key.WithHelp("shift+↓", "scroll a line down"))
	k.Chat.Top = key.NewBinding(key.WithKeys("ctrl+home"), key.WithHelp("ctrl+home", "top of the chat"))
	k.Chat.Bottom = key.NewBinding(key.WithKeys("ctrl+end"), key.WithHelp("ctrl+end", "bottom of the chat"))
	k.Chat.Thinking = key.NewBinding(key.WithKeys("ctrl+t"), key.WithHelp("ctrl+t", "show/hide thinking"))
	k.Chat.Mouse = key.NewBinding(key.WithKeys("ctrl+o"), key.WithHelp("ctrl+o", "mouse: scroll/select text"))

	k.Chats.New = key.NewBinding(key.WithKeys("ctrl+n"), key.WithHelp("ctrl+n", "new chat"))
	k.Chats.Prev = key.NewBinding(key.WithKeys("ctrl+left", "ctrl+pgup"), key.WithHelp("ctrl+←", "previous chat"))
	k.Chats.Next = key.NewBinding(key.WithKeys("ctrl+right", "ctrl+pgdown"), key.WithHelp("ctrl+→", "next chat"))

	k.Choice.Prev = key.NewBinding(key.WithKeys("shift+left"), key.WithHelp("shift+←", "previous alternative"))
	k.Choice.Next = key.NewBinding(key.WithKeys("shift+right"), key.WithHelp("shift+→", "next alternative"))
	k.Choice.Keep = key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "keep the alternative shown"))

	k.Complete.Next = key.NewBinding(key.WithKeys("down", "ctrl+n"), key.WithHelp("↓", "next"))
	k.Complete.Prev = key.NewBinding(key.WithKeys("up", "ctrl+p"), key.WithHelp("↑", "previous"))
	k.Complete.Accept = key.NewBinding(key.WithKeys("tab"), key.WithHelp("tab", "complete"))
	k.Complete.Close = key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "close"))

	k.Stop = key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "stop the reply"))
	k.Quit = key.NewBinding(key.WithKeys("ctrl+c"), key.WithHelp("ctrl+c", "stop; twice: quit"))
	return k
}

// helpGroups is the key map as /help lists it.
func (k KeyMap) helpGroups() [][]key.Binding {
	return [][]key.Binding{
		{k.Input.Send, k.Input.Newline, k.Input.HistPrv, k.Input.HistNxt},
		{k.Chat.PageUp, k.Chat.PageDown, k.Chat.LineUp, k.Chat.LineDown, k.Chat.Top, k.Chat.Bottom},
		{k.Chats.New, k.Chats.Prev, k.Chats.Next},
		{k.Choice.Prev, k.Choice.Next, k.Choice.Keep},
		{k.Chat.Thinking, k.Chat.Mouse, k.Complete.Accept, k.Stop, k.Quit},
	}
}

// keyPair names two keys for a hint: "shift+←/→" when they share a
// modifier, "a/b" otherwise.
func keyPair(a, b key.Binding) string {
	ka, kb := a.Help().Key, b.Help().Key
	if i := strings.LastIndexByte(ka, '+'); i > 0 && strings.HasPrefix(kb, ka[:i+1]) {
		return ka + "/" + kb[i+1:]
	}
	return ka + "/" + kb
}
