// Package ui is ferrite's terminal chat: one bubbletea program that runs the
// engine in-process and streams replies into a scrollable, Markdown-rendered
// conversation with live engine statistics.
//
// # Using it
//
// The chat talks to an Engine, a small interface defined here: Info, Send
// (a conversation in, a Reply stream out) and Stats. NewRuntimeEngine
// implements it on an engine/runtime.Runtime and a tokenizer (chat
// template, encoding, EOS ids); the runtime must decode text
// (runtime.Options.NewDecoder returning tok.NewStreamDecoder()). Run opens
// the chat full-screen and returns when the user quits:
//
//	eng := ui.NewRuntimeEngine(rt, tok, ui.ModelInfo{Name: "Qwen3-0.6B", Arch: "qwen3"})
//	err := ui.Run(ctx, eng, ui.Options{Settings: &settings, System: system})
//
// Run uses the alternate screen and the mouse wheel, gives the terminal
// back however it ends, and returns a panic in the chat as an error.
//
// # Structure
//
// There is one bubbletea model (model.go). Its parts are plain structs that
// it drives and that have no Update of their own: chatView (the scrollable
// conversation, chatview.go), input (the textarea and its history),
// completion (the slash-command popup) and statusBar. Update is split by
// concern: update_keys.go (keys, mouse, slash-command dispatch),
// update_stream.go (sending, streaming, rendering, saving),
// commands_run.go (the slash commands). Keys live in keys.go (KeyMap),
// styles in styles.go (Styles, built from a Palette; NO_COLOR gives a
// colourless one). All message types are declared in one block in model.go.
//
// # Rules
//
//   - Update does no IO and no slow work. Engine calls, glamour rendering,
//     file writes and the clipboard run in commands, which never touch the
//     model: they return a message and Update applies it.
//   - A reply is pulled one event per command (waitForEvent), re-issued by
//     Update after every delta; the runtime merges deltas while the UI is
//     busy, so the UI never falls behind. Stale events (a reply that was
//     stopped and forgotten by /new, /clear or /load) carry an old id and
//     are dropped.
//   - Replies are rendered with glamour, one renderer per width (made again
//     on resize). A finished reply is rendered once per width and cached;
//     the streaming reply is re-rendered at most every renderInterval, and
//     only one render per message is in flight. Until a rendering arrives the
//     plain text is shown.
//   - <think>…</think> blocks (also a reply that starts inside the block,
//     when the template opened it) are shown dimmed or collapsed to one line
//     (ctrl+t), are excluded from /copy, and go back to the model as
//     ReasoningContent.
//   - The view follows new output only while it is scrolled to the bottom:
//     scrolling up stops following, scrolling back down resumes it.
//   - Ctrl+C stops a reply first; pressed again (with no key in between)
//     it quits. Esc also stops a reply.
//
// # Chats on disk
//
// Every chat is saved after each message to
// $XDG_DATA_HOME/ferrite/chats/<id>.json (or the /save name), written
// atomically: a temporary file in the same directory, fsync, rename, and
// an fsync of the directory. Saves carry a sequence number, so a slow save
// never overwrites a newer one. The JSON (Chat) is complete: model,
// system prompt, settings, and every message with its time and, for
// replies, statistics and the settings it was sampled with; /load and
// UnmarshalChat read it back. /export md writes the same chat as Markdown.
//
// # Testing
//
// Program tests drive the whole model with teatest against a scripted fake
// engine; golden files in testdata/ hold whole screens at a fixed size with
// no colour profile (go test ./ui/ -update regenerates them). Tests on the
// real runtime use a tiny random-weight Qwen3 with the Qwen3 tokenizer.
package ui
