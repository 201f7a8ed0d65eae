package jinja

// ferrite: this file and the lines marked "ferrite:" elsewhere are ferrite's
// changes to ardanlabs/jinja v1.8.0: resource limits, so that a hostile
// template can neither exhaust memory in one operation ('a' * 10**12,
// s.replace('', s), indent(10**12), a list joined with itself...) nor run on
// after its deadline, even inside one expression.

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxValueBytes bounds every string a rendering builds (in bytes), every list
// it builds from a string (at itemBytes per item) and the output of a
// rendering. An operation that would build a bigger one fails before it
// allocates.
const MaxValueBytes = 64 << 20

// itemBytes is the memory one list item takes, about: a Value and, for a
// string item, its header.
const itemBytes = 32

// maxDepth bounds the nesting printedSize walks (deeper is "too big").
const maxDepth = 10_000

// checkEvery is how many evaluation steps pass between calls of Limits.Check.
const checkEvery = 16

// Limits bound one rendering (see Template.RenderLimited).
type Limits struct {
	// MaxOutput bounds the output in bytes; 0 or more than MaxValueBytes
	// means MaxValueBytes.
	MaxOutput int64
	// Budget bounds the bytes of the strings and lists a rendering builds,
	// garbage included, so that a loop building big values cannot hold
	// more than this much memory; 0 means no bound.
	Budget int64
	// Check, when set, is called every few evaluation steps (every node and
	// expression is a step); an error ends the rendering with that error.
	Check func() error
}

// LimitError reports an operation that would build a value bigger than the
// limits allow.
type LimitError struct {
	What  string // the operation: "string repetition", "output", ...
	Bytes int64  // the size it would have; -1 when it overflows int64
	Limit int64
}

func (e *LimitError) Error() string {
	if e.Bytes < 0 {
		return fmt.Sprintf("%s too big (more than the limit of %d bytes)", e.What, e.Limit)
	}
	return fmt.Sprintf("%s too big (%d bytes, more than the limit of %d)", e.What, e.Bytes, e.Limit)
}

// limiter is the state of Limits during one rendering, shared by the
// evaluators of macros, blocks and calls. A nil limiter limits nothing but
// the size of single values.
type limiter struct {
	Limits
	steps int
	used  int64
}

// step counts one evaluation step and calls Check every checkEvery steps.
func (l *limiter) step() error {
	if l == nil || l.Check == nil {
		return nil
	}
	l.steps++
	if l.steps%checkEvery != 0 {
		return nil
	}
	return l.Check()
}

// charge counts n bytes built against the budget.
func (l *limiter) charge(n int64) error {
	if l == nil || l.Budget <= 0 {
		return nil
	}
	l.used += n
	if l.used > l.Budget {
		return &LimitError{What: "memory built by the rendering", Bytes: l.used, Limit: l.Budget}
	}
	return nil
}

// maxOutput is the output bound in bytes.
func (l *limiter) maxOutput() int64 {
	if l == nil || l.MaxOutput <= 0 || l.MaxOutput > MaxValueBytes {
		return MaxValueBytes
	}
	return l.MaxOutput
}

// valueBytes is the memory a built value takes, about: a string's length, a
// list's items, a dict's keys and values (not counting shared contents).
func valueBytes(v Value) int64 {
	switch v.kind {
	case KindString:
		return int64(len(v.AsString()))
	case KindList:
		return int64(v.AsList().Len()) * itemBytes
	case KindDict:
		return int64(v.AsDict().Len()) * 2 * itemBytes
	}
	return 0
}

// mustFit panics with a *LimitError when n bytes are more than
// MaxValueBytes; render recovers it into an error. (The library's helpers
// return no errors, so a panic is the only way out of them.)
func mustFit(what string, n int64) {
	if n < 0 || n > MaxValueBytes {
		panic(&LimitError{What: what, Bytes: n, Limit: MaxValueBytes})
	}
}

// mustFitItems is mustFit for a list of n items.
func mustFitItems(what string, n int) {
	if n > MaxValueBytes/itemBytes {
		panic(&LimitError{What: what, Bytes: mulSat(int64(n), itemBytes), Limit: MaxValueBytes})
	}
}

// mulSat multiplies non-negative a and b, giving -1 on overflow.
func mulSat(a, b int64) int64 {
	if a < 0 || b < 0 {
		return -1
	}
	if a != 0 && b > (1<<63-1)/a {
		return -1
	}
	return a * b
}

// addSat adds non-negative a and b, giving -1 on overflow or when either is -1.
func addSat(a, b int64) int64 {
	if a < 0 || b < 0 || a > (1<<63-1)-b {
		return -1
	}
	return a + b
}

// repeatChecked is strings.Repeat within MaxValueBytes; a negative count
// gives "" as in Python.
func repeatChecked(what, s string, n int64) string {
	if n <= 0 || s == "" {
		return ""
	}
	mustFit(what, mulSat(int64(len(s)), n))
	return strings.Repeat(s, int(n))
}

// replaceChecked is strings.Replace within MaxValueBytes.
func replaceChecked(what, s, old, new string, n int) string {
	m := 0
	if old == "" {
		m = utf8.RuneCountInString(s) + 1
	} else if len(new) > len(old) {
		m = strings.Count(s, old)
	}
	if n >= 0 && n < m {
		m = n
	}
	if len(new) > len(old) {
		mustFit(what, addSat(int64(len(s)), mulSat(int64(m), int64(len(new)-len(old)))))
	}
	return strings.Replace(s, old, new, n)
}

// concatChecked is a + b within MaxValueBytes.
func concatChecked(what, a, b string) string {
	mustFit(what, int64(len(a))+int64(len(b)))
	return a + b
}

// printedSize is a bound on the length of printValue(v) (json: of its JSON
// encoding with the given indent, strings counted at 6 bytes a byte for
// \u escapes), or MaxValueBytes+1 once it passes MaxValueBytes. It stops
// there, so a list holding itself many times over is not walked in full.
func printedSize(v Value, json bool, indent int64) int64 {
	var total int64
	var walk func(v Value, depth int64)
	walk = func(v Value, depth int64) {
		if total > MaxValueBytes || depth > maxDepth {
			total = MaxValueBytes + 1
			return
		}
		pad := addSat(1, mulSat(indent, depth+1)) // newline and indent of an item
		switch v.kind {
		case KindString:
			n := int64(len(v.AsString()))
			if json {
				n *= 6
			}
			total = addSat(total, n+2)
		case KindList:
			total = addSat(total, 2+pad)
			for _, it := range v.AsList().Items {
				total = addSat(total, addSat(2, pad))
				walk(it, depth+1)
				if total < 0 || total > MaxValueBytes {
					break
				}
			}
		case KindDict:
			d := v.AsDict()
			total = addSat(total, 2+pad)
			for _, k := range d.Keys {
				n := int64(len(k))
				if json {
					n *= 6
				}
				total = addSat(total, addSat(n+6, pad))
				val, _ := d.Get(k)
				walk(val, depth+1)
				if total < 0 || total > MaxValueBytes {
					break
				}
			}
		default:
			total = addSat(total, 32)
		}
		if total < 0 {
			total = MaxValueBytes + 1
		}
	}
	walk(v, 0)
	return total
}

// mustPrint checks that printing v (a list or dict) fits.
func mustPrint(what string, v Value) {
	if v.kind == KindList || v.kind == KindDict {
		if n := printedSize(v, false, 0); n > MaxValueBytes {
			mustFit(what, n)
		}
	}
}
