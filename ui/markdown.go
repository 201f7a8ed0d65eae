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
func wrapText(s string, width int) string {
	return xansi.Wrap(s, max(width, 1), "")
}
