package ui

import (
	"strings"
	"sync"

	"github.com/charmbracelet/glamour"
	"github.com/charmbracelet/glamour/ansi"
	xansi "github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"
)

// markdown renders Markdown at one width. The model makes a new one when
// the width changes and hands it to render commands; glamour's renderer
// is stateful, so its calls are serialized.
type markdown struct {
	width int

	mu sync.Mutex
	r  *glamour.TermRenderer // nil when glamour refused the style: plain text then
}

func newMarkdown(width int, style ansi.StyleConfig, profile termenv.Profile) *markdown {
	width = max(width, 10)
	r, err := glamour.NewTermRenderer(
		glamour.WithStyles(style),
		glamour.WithWordWrap(width),
		glamour.WithColorProfile(profile),
	)
	if err != nil {
		r = nil
	}
	return &markdown{width: width, r: r}
}

// render returns text rendered for the terminal, without the blank lines
// glamour puts around a document. Should glamour fail, it returns the text
// wrapped, unrendered.
func (md *markdown) render(text string) string {
	text = printable(text)
	md.mu.Lock()
	defer md.mu.Unlock()
	if md.r != nil {
		if out, err := md.r.Render(text); err == nil {
			return trimBlankLines(out)
		}
	}
	return wrapText(text, md.width)
}

// trimBlankLines drops leading and trailing lines that hold only spaces,
// and the spaces glamour pads every line's end with.
func trimBlankLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return strings.Join(lines, "\n")
}

// wrapText wraps plain text at width columns, keeping its line breaks.
// The text is made printable first.
func wrapText(s string, width int) string {
	return xansi.Wrap(printable(s), max(width, 1), "")
}

// tabWidth is the spaces a tab is shown as.
const tabWidth = 4

// printable replaces what a terminal would act on instead of showing:
// the C0 control characters other than newline by their Unicode control
// pictures (␛ for ESC, ␍ for CR), DEL by ␡, the C1 controls by U+FFFD, and
// a tab by spaces. A model's output (or a pasted text) then can never move
// the cursor or change the terminal's state, and widths stay right.
func printable(s string) string {
	i := strings.IndexFunc(s, func(r rune) bool { return r != '\n' && (r < 0x20 || (r >= 0x7f && r <= 0x9f)) })
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for _, r := range s[i:] {
		switch {
		case r == '\n':
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(strings.Repeat(" ", tabWidth))
		case r < 0x20:
			b.WriteRune(0x2400 + r)
		case r == 0x7f:
			b.WriteRune('\u2421')
		case r >= 0x80 && r <= 0x9f:
			b.WriteRune('\uFFFD')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
