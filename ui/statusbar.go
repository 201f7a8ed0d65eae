package ui

import (
	"fmt"
	"math"
	"strings"

	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"

	"github.com/ferrite-llm/ferrite/internal/units"
	"github.com/ferrite-llm/ferrite/kernels"
)

// kvBarWidth is the width of the KV-cache bar, in cells.
const kvBarWidth = 10

// ctxWarnFraction is the share of the context above which the status bar
// warns.
const ctxWarnFraction = 0.9

// statusData is what the status bar shows.
type statusData struct {
	info    ModelInfo
	busy    int    // replies the shown chat is generating
	others  []int  // the numbers of the other chats that are generating
	loading string // a model being loaded: name, stage and time so far
	pulling string // a model being downloaded: name and progress
	usage   *Usage // the current or last reply's; nil before the first token
	stats   Stats
	ctxUsed int
	draft   int // the shown chat's MTP draft length; 0: no speculation
}

// statusBar is the line at the bottom: model, speed of the current reply,
// KV-cache use, context use and sequences. Segments that do not fit are
// dropped, least important first.
type statusBar struct {
	st *Styles
}

// segment is one part of the bar; lower prio is dropped first.
type segment struct {
	text string
	prio int
}

func (b statusBar) render(width int, d statusData) string {
	st := b.st.Status
	label := func(s string) string { return st.Label.Render(s) }
	value := func(s string) string { return st.Value.Render(s) }
	var segs []segment

	model := st.Model.Render(d.info.Name)
	if d.info.Arch != "" {
		model += label(" " + d.info.Arch)
	}
	if d.info.Remote {
		model += label(" ⇄ remote")
	}
	segs = append(segs, segment{model, 9})
	if d.info.Device != "" {
		segs = append(segs, segment{label(deviceShort(d.info.Device)), 3})
	}
	if mem := d.stats.Memory; mem.OnDevice {
		// Outlives the device's name: at 80 columns the memory is what
		// matters.
		segs = append(segs, segment{label("GPU ") + value(gpuMemory(mem)), 4})
	}
	if d.loading != "" {
		segs = append(segs, segment{st.Busy.Render("⟳ " + d.loading), 8})
	}
	if d.pulling != "" {
		segs = append(segs, segment{st.Busy.Render("⇣ " + d.pulling), 8})
	}
	switch {
	case d.busy == 1:
		segs = append(segs, segment{st.Busy.Render("● generating"), 5})
	case d.busy > 1:
		segs = append(segs, segment{st.Busy.Render(fmt.Sprintf("● generating %d", d.busy)), 5})
	}
	if len(d.others) > 0 {
		nums := make([]string, len(d.others))
		for i, n := range d.others {
			nums[i] = fmt.Sprint(n)
		}
		word := "chat"
		if len(nums) > 1 {
			word = "chats"
		}
		segs = append(segs, segment{st.Busy.Render(fmt.Sprintf("● %s %s", word, strings.Join(nums, ","))), 4})
	}
	if u := d.usage; u != nil && u.GeneratedTokens > 0 {
		segs = append(segs, segment{value(fmt.Sprintf("%.1f", u.DecodeTokensPerSec)) + label(" tok/s"), 6})
		segs = append(segs, segment{label("TTFT ") + value(formatMillis(float64(u.TimeToFirstToken.Microseconds())/1000)), 4})
	}
	switch u := d.usage; {
	case u != nil && u.DraftTokens > 0:
		segs = append(segs, segment{mtpSegment(label, value, float64(u.AcceptedTokens)/float64(u.DraftTokens), u.AcceptedPerStep), 6})
	case d.draft > 0 && d.stats.DraftTokens > 0:
		segs = append(segs, segment{mtpSegment(label, value, d.stats.AcceptRate, d.stats.AcceptedPerStep), 6})
	case d.draft > 0:
		segs = append(segs, segment{label("MTP ") + value(fmt.Sprintf("on, %d drafts", d.draft)), 5})
	}
	if s := d.stats; s.KVBlocksTotal > 0 {
		frac := float64(s.KVBlocksUsed) / float64(s.KVBlocksTotal)
		full := min(int(frac*kvBarWidth+0.5), kvBarWidth)
		if s.KVBlocksUsed > 0 && full == 0 {
			full = 1
		}
		bar := st.BarFull.Render(strings.Repeat("█", full)) + st.BarEmpty.Render(strings.Repeat("░", kvBarWidth-full))
		segs = append(segs, segment{label("KV ") + bar + value(" "+percent(s.KVBlocksUsed, s.KVBlocksTotal)), 7})
		segs = append(segs, segment{label(fmt.Sprintf("%d/%d blk · %s/%s", s.KVBlocksUsed, s.KVBlocksTotal,
			formatBytes(s.KVBytesUsed), formatBytes(s.KVBytesTotal))), 2})
	}
	if limit := d.info.MaxContext; limit > 0 {
		// A reply that fills the context ends with a token it never
		// stores: the context holds at most limit tokens.
		used := min(d.ctxUsed, limit)
		text := label("ctx ") + value(fmt.Sprintf("%d/%d", used, limit))
		if float64(used) >= ctxWarnFraction*float64(limit) {
			text = st.Warning.Render(fmt.Sprintf("⚠ ctx %d/%d", used, limit))
		}
		if d.info.KVLimited {
			text += label(" (KV budget)")
		}
		segs = append(segs, segment{text, 8})
	}
	segs = append(segs, segment{label(fmt.Sprintf("run %d · wait %d", d.stats.Running, d.stats.Waiting)), 3})

	sep := label(" │ ")
	join := func() string {
		parts := make([]string, len(segs))
		for i, s := range segs {
			parts[i] = s.text
		}
		return st.Bar.Render(" ") + strings.Join(parts, sep)
	}
	line := join()
	for xansi.StringWidth(line) > width && len(segs) > 1 {
		low := 0
		for i, s := range segs {
			if s.prio <= segs[low].prio { // of equals, the later goes first
				low = i
			}
		}
		segs = append(segs[:low], segs[low+1:]...)
		line = join()
	}
	line = xansi.Truncate(line, width, "…")
	if pad := width - lipgloss.Width(line); pad > 0 {
		line += st.Bar.Render(strings.Repeat(" ", pad))
	}
	return line
}

// percent is used/total as a whole percentage. A share above 0 that
// rounds to 0 is "<1%", in agreement with the KV bar's one filled cell.
func percent(used, total int) string {
	p := 100 * float64(used) / float64(total)
	if used > 0 && p < 0.5 {
		return "<1%"
	}
	return fmt.Sprintf("%d%%", int(math.Round(p)))
}

// mtpSegment shows speculative decoding's acceptance: the share of drafts
// accepted and the tokens each verify step yields (its own one plus the
// accepted drafts), e.g. "MTP 80% · 3.4/step".
func mtpSegment(label, value func(string) string, rate, acceptedPerStep float64) string {
	return label("MTP ") + value(fmt.Sprintf("%.0f%%", 100*rate)) +
		label(" · ") + value(fmt.Sprintf("%.1f", 1+acceptedPerStep)) + label("/step")
}

// formatBytes prints a byte count in binary units.
func formatBytes(n int64) string { return units.Bytes(n) }

// deviceShort is the status bar's name for a device: its first word and
// the GPU's name without the details in brackets ("cuda:0 NVIDIA H200",
// "cpu").
func deviceShort(desc string) string {
	if i := strings.Index(desc, " ("); i >= 0 {
		return desc[:i]
	}
	return desc
}

// gpuMemory is the device memory the model holds over the device's total,
// in GiB: "17.2/139 GiB" ("17.2 GiB" when the total is unknown).
func gpuMemory(u kernels.MemoryUse) string {
	gib := func(n int64) string {
		g := float64(n) / (1 << 30)
		if g >= 100 {
			return fmt.Sprintf("%.0f", g)
		}
		return fmt.Sprintf("%.1f", g)
	}
	if u.Total <= 0 {
		return gib(u.Used()) + " GiB"
	}
	return gib(u.Used()) + "/" + gib(u.Total) + " GiB"
}
