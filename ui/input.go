package ui

import (
	"slices"
	"strings"

	"github.com/charmbracelet/bubbles/cursor"
	"github.com/charmbracelet/bubbles/textarea"
	tea "github.com/charmbracelet/bubbletea"
	xansi "github.com/charmbracelet/x/ansi"
)

// maxInputLines is the most lines the input grows to before it scrolls.
const maxInputLines = 8

// tabRune stands for a tab inside the textarea, whose sanitizer would turn
// the tab of a paste into 4 spaces: the message keeps its tabs. It is a
// private-use code point, shown as tabShown.
const (
	tabRune  = '\uE009'
	tabShown = "→"
)

// toTextarea and fromTextarea convert between a message and the
// textarea's text (tabs as tabRune).
func toTextarea(s string) string   { return strings.ReplaceAll(s, "\t", string(tabRune)) }
func fromTextarea(s string) string { return strings.ReplaceAll(s, string(tabRune), "\t") }

// input is the message editor: a textarea that grows with its text, and
// the history of what was sent (Up and Down recall it).
type input struct {
	ta      textarea.Model
	st      *Styles
	history []string // oldest first
	histPos int      // index into history while browsing; len(history) when not
	draft   string   // what was typed before browsing started
	// restored says the text is a message put back after it could not be
	// sent. It is shown dimmed and acts as selected: typing or pasting
	// replaces it, any other key that reaches the input (an arrow,
	// backspace) keeps it for editing.
	restored bool
}

func newInput(km KeyMap, st *Styles) *input {
	ta := textarea.New()
	ta.Placeholder = "Message (/ for commands, alt+enter for a newline)"
	ta.ShowLineNumbers = false
	ta.Prompt = "› "
	ta.CharLimit = 0
	ta.MaxHeight = maxInputLines
	ta.KeyMap.InsertNewline = km.Input.Newline
	ta.KeyMap.TransposeCharacterBackward.Unbind() // ctrl+t toggles thinking
	ta.Cursor.SetMode(cursor.CursorStatic)        // no blink: fewer redraws while streaming
	fs, bs := textarea.DefaultStyles()
	for _, s := range []*textarea.Style{&fs, &bs} {
		s.Base = s.Base.UnsetBorderStyle()
		s.CursorLine = st.Input.Text
		s.Text = st.Input.Text
		s.Prompt = st.Input.Prompt
		s.Placeholder = st.Input.Holder
		s.EndOfBuffer = st.Input.Holder
	}
	ta.FocusedStyle, ta.BlurredStyle = fs, bs
	ta.SetHeight(1)
	ta.Focus()
	return &input{ta: ta, st: st}
}

// restore puts a message that could not be sent back, as selected text.
func (in *input) restore(s string) {
	in.SetValue(s)
	in.setRestored(true)
}

func (in *input) setRestored(on bool) {
	if in.restored == on {
		return
	}
	in.restored = on
	text := in.st.Input.Text
	if on {
		text = in.st.Input.Restored
	}
	in.ta.FocusedStyle.Text, in.ta.FocusedStyle.CursorLine = text, text
	// The textarea draws with a pointer to the style it was focused with,
	// which may be an earlier copy's: focusing again points it here.
	in.ta.Focus()
}

func (in *input) SetWidth(w int) {
	in.ta.SetWidth(max(w, 4))
	in.fit()
}

// Height is the number of rows the input takes.
func (in *input) Height() int { return in.ta.Height() }

// fit sets the textarea's height to its wrapped text, up to maxInputLines.
func (in *input) fit() {
	w := max(in.ta.Width(), 1)
	rows := 0
	for _, l := range strings.Split(in.ta.Value(), "\n") {
		rows += max(1, (xansi.StringWidth(l)+w)/w) // a full line wraps the cursor onto the next row
	}
	in.ta.SetHeight(min(max(rows, 1), maxInputLines))
}

// Update passes a message to the textarea. The textarea scrolls when the
// cursor leaves its height and never scrolls back when it grows, so it is
// given its full height for the update and fitted to the text after.
func (in *input) Update(msg tea.Msg) tea.Cmd {
	if in.restored {
		if k, ok := msg.(tea.KeyMsg); ok && (k.Type == tea.KeyRunes || k.Type == tea.KeySpace) {
			in.ta.Reset()
		}
		in.setRestored(false)
	}
	if k, ok := msg.(tea.KeyMsg); ok && k.Type == tea.KeyRunes && slices.Contains(k.Runes, '\t') {
		k.Runes = slices.Clone(k.Runes)
		for i, r := range k.Runes {
			if r == '\t' {
				k.Runes[i] = tabRune
			}
		}
		msg = k
	}
	var cmd tea.Cmd
	in.ta.SetHeight(maxInputLines)
	in.ta, cmd = in.ta.Update(msg)
	in.fit()
	return cmd
}

func (in *input) Value() string { return fromTextarea(in.ta.Value()) }

func (in *input) SetValue(s string) {
	in.setRestored(false)
	in.ta.SetValue(toTextarea(s))
	in.fit()
}

func (in *input) Reset() {
	in.setRestored(false)
	in.ta.Reset()
	in.histPos = len(in.history)
	in.draft = ""
	in.fit()
}

func (in *input) View() string {
	return strings.ReplaceAll(in.ta.View(), string(tabRune), tabShown)
}

// onFirstRow reports whether the cursor is on the first visual row: Up
// there recalls history instead of moving the cursor.
func (in *input) onFirstRow() bool {
	return in.ta.Line() == 0 && in.ta.LineInfo().RowOffset == 0
}

// onLastRow reports whether the cursor is on the last visual row.
func (in *input) onLastRow() bool {
	li := in.ta.LineInfo()
	return in.ta.Line() == in.ta.LineCount()-1 && li.RowOffset == li.Height-1
}

// remember adds a sent input to the history (not twice in a row); it
// reports whether it was added.
func (in *input) remember(s string) bool {
	added := s != "" && (len(in.history) == 0 || in.history[len(in.history)-1] != s)
	if added {
		in.history = append(in.history, s)
	}
	in.histPos = len(in.history)
	return added
}

// prepend puts older entries (an earlier session's) before the history,
// keeping the newest maxHistory in all.
func (in *input) prepend(old []string) {
	if len(old) == 0 {
		return
	}
	browsing := in.histPos < len(in.history)
	h := append(append([]string(nil), old...), in.history...)
	// Drop a repeat at the seam, as remember would have.
	if len(in.history) > 0 && len(old) > 0 && old[len(old)-1] == in.history[0] {
		h = append(h[:len(old)-1], h[len(old):]...)
	}
	if len(h) > maxHistory {
		h = h[len(h)-maxHistory:]
	}
	shift := len(h) - len(in.history)
	in.history = h
	if browsing {
		in.histPos = max(in.histPos+shift, 0)
	} else {
		in.histPos = len(h)
	}
}

// prev recalls the previous history entry; false when there is none.
func (in *input) prev() bool {
	if in.histPos == 0 {
		return false
	}
	if in.histPos == len(in.history) {
		in.draft = in.ta.Value()
	}
	in.histPos--
	in.setRestored(false)
	in.ta.SetValue(toTextarea(in.history[in.histPos]))
	in.ta.CursorStart()
	in.moveToFirstLine()
	in.fit()
	return true
}

// next recalls the next history entry, or the draft after the newest;
// false when not browsing.
func (in *input) next() bool {
	if in.histPos >= len(in.history) {
		return false
	}
	in.histPos++
	in.setRestored(false)
	if in.histPos == len(in.history) {
		in.ta.SetValue(in.draft)
	} else {
		in.ta.SetValue(toTextarea(in.history[in.histPos]))
	}
	in.fit()
	return true
}

// moveToFirstLine puts the cursor on the first line, so that another Up
// goes further back in history at once.
func (in *input) moveToFirstLine() {
	for in.ta.Line() > 0 {
		in.ta.CursorUp()
	}
	in.ta.CursorStart()
}
