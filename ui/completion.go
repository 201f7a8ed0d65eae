package ui

import (
	"strings"

	xansi "github.com/charmbracelet/x/ansi"
)

// maxCompletions is the most items the popup shows at once.
const maxCompletions = 8

// compItem is one completion: the input it completes to, and what it is.
type compItem struct {
	value string // the whole input after completing, e.g. "/set temperature "
	label string // what the popup shows, e.g. "/set"
	args  string // the arguments, e.g. "<name> <value>"
	desc  string
	keep  bool // shown even when it is exactly the input (it says what the input means)
}

// completion is the popup above the input that completes slash commands
// and their first argument. It is open while the input is a single-line
// slash command with something to complete, unless the user dismissed it
// (Esc) for the current text.
type completion struct {
	items     []compItem
	sel       int
	dismissed string // the input the user closed the popup on
	input     string // the input items were computed for
}

// update recomputes the items for the input's value.
func (c *completion) update(value string, cmds *commandSet, m *model) {
	if value == c.input {
		return
	}
	c.input = value
	c.sel = 0
	c.items = nil
	if value != c.dismissed {
		c.dismissed = ""
	}
	if !strings.HasPrefix(value, "/") || strings.Contains(value, "\n") {
		return
	}
	c.items = cmds.complete(value, m)
	// An exact, complete match needs no popup.
	if len(c.items) == 1 && c.items[0].value == value && !c.items[0].keep {
		c.items = nil
	}
}

func (c *completion) open() bool { return len(c.items) > 0 && c.dismissed == "" }

func (c *completion) close() { c.dismissed = c.input }

func (c *completion) move(d int) {
	if n := len(c.items); n > 0 {
		c.sel = (c.sel + d + n) % n
	}
}

func (c *completion) selected() compItem { return c.items[c.sel] }

// render draws the popup, at most width columns wide.
func (c *completion) render(st *Styles, width int) string {
	first := 0
	if c.sel >= maxCompletions {
		first = c.sel - maxCompletions + 1
	}
	last := min(first+maxCompletions, len(c.items))
	labelW := 0
	for _, it := range c.items[first:last] {
		labelW = max(labelW, xansi.StringWidth(it.label+" "+it.args))
	}
	inner := max(width-st.Complete.Box.GetHorizontalFrameSize(), 10)
	lines := make([]string, 0, last-first)
	for i := first; i < last; i++ {
		it := c.items[i]
		head := it.label
		if it.args != "" {
			head += " " + it.args
		}
		head += strings.Repeat(" ", labelW-xansi.StringWidth(head))
		mark, style := "  ", st.Complete.Item
		if i == c.sel {
			mark, style = "› ", st.Complete.Selected
		}
		line := style.Render(mark+head) + "  " + st.Complete.Desc.Render(it.desc)
		lines = append(lines, xansi.Truncate(line, inner, "…"))
	}
	return st.Complete.Box.Render(strings.Join(lines, "\n"))
}
