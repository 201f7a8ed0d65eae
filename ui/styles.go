package ui

import (
	"github.com/charmbracelet/glamour/ansi"
	"github.com/charmbracelet/glamour/styles"
	"github.com/charmbracelet/lipgloss"
)

// Palette is the few semantic colours every style is built from.
type Palette struct {
	Accent  lipgloss.TerminalColor // the assistant, the selection, the KV bar
	User    lipgloss.TerminalColor // the user's turns
	Text    lipgloss.TerminalColor
	Muted   lipgloss.TerminalColor // secondary text: times, stats, thinking
	Border  lipgloss.TerminalColor
	Warning lipgloss.TerminalColor
	Error   lipgloss.TerminalColor
	Bar     lipgloss.TerminalColor // the status bar's background
}

// DefaultPalette adapts to light and dark terminals.
func DefaultPalette() Palette {
	return Palette{
		Accent:  lipgloss.AdaptiveColor{Light: "#5A4FCF", Dark: "#9D8CFF"},
		User:    lipgloss.AdaptiveColor{Light: "#0B7A75", Dark: "#5FD7C7"},
		Text:    lipgloss.AdaptiveColor{Light: "#1F1F1F", Dark: "#E4E4E4"},
		Muted:   lipgloss.AdaptiveColor{Light: "#767676", Dark: "#8A8A8A"},
		Border:  lipgloss.AdaptiveColor{Light: "#C6C6C6", Dark: "#444444"},
		Warning: lipgloss.AdaptiveColor{Light: "#B35C00", Dark: "#FFAF5F"},
		Error:   lipgloss.AdaptiveColor{Light: "#C0262D", Dark: "#FF6B6B"},
		Bar:     lipgloss.AdaptiveColor{Light: "#E8E8E8", Dark: "#262626"},
	}
}

// NoColorPalette has no colours at all (NO_COLOR): distinctions are
// carried by glyphs and text attributes.
func NoColorPalette() Palette {
	n := lipgloss.NoColor{}
	return Palette{Accent: n, User: n, Text: n, Muted: n, Border: n, Warning: n, Error: n, Bar: n}
}

// Styles is every style the chat draws with. Components get it from the
// model; nothing else defines colours.
type Styles struct {
	Chat struct {
		UserLabel      lipgloss.Style
		AssistantLabel lipgloss.Style
		Time           lipgloss.Style
		UserBody       lipgloss.Style // the user's text, behind a left bar
		Think          lipgloss.Style // <think> text
		ThinkHeader    lipgloss.Style // the collapsed/expanded line
		ReplyStats     lipgloss.Style // the line under a finished reply
		Notice         lipgloss.Style // command output
		Warning        lipgloss.Style
		Error          lipgloss.Style
	}
	Input struct {
		Rule     lipgloss.Style // the line above the input
		Hint     lipgloss.Style // a hint written into the rule
		Warning  lipgloss.Style // a warning written into the rule
		Prompt   lipgloss.Style
		Text     lipgloss.Style
		Holder   lipgloss.Style // placeholder
		Restored lipgloss.Style // a message put back after it could not be sent (typing replaces it)
	}
	Tabs struct { // the strip of open chats
		Tab    lipgloss.Style
		Active lipgloss.Style
		Busy   lipgloss.Style // the ● of a chat that is generating
		Sep    lipgloss.Style
	}
	Choice struct { // the alternatives of /regen
		Header   lipgloss.Style
		Option   lipgloss.Style
		Selected lipgloss.Style
	}
	Complete struct {
		Box      lipgloss.Style
		Item     lipgloss.Style
		Selected lipgloss.Style
		Desc     lipgloss.Style
	}
	Status struct {
		Bar      lipgloss.Style
		Model    lipgloss.Style
		Label    lipgloss.Style
		Value    lipgloss.Style
		BarFull  lipgloss.Style // the used part of the KV bar
		BarEmpty lipgloss.Style
		Busy     lipgloss.Style
		Warning  lipgloss.Style
	}
	// Markdown is glamour's style for replies.
	Markdown ansi.StyleConfig
}

// NewStyles builds the styles from a palette. dark picks glamour's dark or
// light Markdown style; noColor picks its colourless one.
func NewStyles(p Palette, dark, noColor bool) Styles {
	var s Styles
	base := lipgloss.NewStyle()

	s.Chat.UserLabel = base.Foreground(p.User).Bold(true)
	s.Chat.AssistantLabel = base.Foreground(p.Accent).Bold(true)
	s.Chat.Time = base.Foreground(p.Muted)
	s.Chat.UserBody = base.Foreground(p.Text).
		Border(lipgloss.Border{Left: "│"}, false, false, false, true).
		BorderForeground(p.User).PaddingLeft(1)
	s.Chat.Think = base.Foreground(p.Muted).Faint(true).Italic(true)
	s.Chat.ThinkHeader = base.Foreground(p.Muted)
	s.Chat.ReplyStats = base.Foreground(p.Muted)
	s.Chat.Notice = base.Foreground(p.Muted)
	s.Chat.Warning = base.Foreground(p.Warning)
	s.Chat.Error = base.Foreground(p.Error)

	s.Input.Rule = base.Foreground(p.Border)
	s.Input.Hint = base.Foreground(p.Muted)
	s.Input.Warning = base.Foreground(p.Warning)
	s.Input.Prompt = base.Foreground(p.Accent)
	s.Input.Text = base.Foreground(p.Text)
	s.Input.Holder = base.Foreground(p.Muted)
	s.Input.Restored = base.Foreground(p.Muted).Italic(true)

	s.Tabs.Tab = base.Foreground(p.Muted)
	s.Tabs.Active = base.Foreground(p.Accent).Bold(true)
	s.Tabs.Busy = base.Foreground(p.Accent)
	s.Tabs.Sep = base.Foreground(p.Border)

	s.Choice.Header = base.Foreground(p.Muted)
	s.Choice.Option = base.Foreground(p.Muted)
	s.Choice.Selected = base.Foreground(p.Accent).Bold(true)

	s.Complete.Box = base.Border(lipgloss.RoundedBorder()).BorderForeground(p.Border).Padding(0, 1)
	s.Complete.Item = base.Foreground(p.Text)
	s.Complete.Selected = base.Foreground(p.Accent).Bold(true)
	s.Complete.Desc = base.Foreground(p.Muted)

	s.Status.Bar = base.Background(p.Bar).Foreground(p.Text)
	s.Status.Model = base.Background(p.Bar).Foreground(p.Accent).Bold(true)
	s.Status.Label = base.Background(p.Bar).Foreground(p.Muted)
	s.Status.Value = base.Background(p.Bar).Foreground(p.Text)
	s.Status.BarFull = base.Background(p.Bar).Foreground(p.Accent)
	s.Status.BarEmpty = base.Background(p.Bar).Foreground(p.Border)
	s.Status.Busy = base.Background(p.Bar).Foreground(p.Accent)
	s.Status.Warning = base.Background(p.Bar).Foreground(p.Warning).Bold(true)

	switch {
	case noColor:
		s.Markdown = styles.NoTTYStyleConfig
	case dark:
		s.Markdown = styles.DarkStyleConfig
	default:
		s.Markdown = styles.LightStyleConfig
	}
	// The chat pads messages itself: no document margin.
	zero := uint(0)
	s.Markdown.Document.Margin = &zero
	return s
}
