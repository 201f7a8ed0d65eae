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
// NewRemoteEngine implements it on a model of an OpenAI-compatible server
// (internal/openai): one streamed chat completion per reply, with speed
// and time to first token measured here (remote_engine.go; the runtime's
// adapter is runtime_engine.go).
//
// Run uses the alternate screen and the mouse wheel, gives the terminal
// back however it ends, and returns a panic in the chat as an error.
//
// Options.Models (List, Find, Load) lets /models list and /model load
// other models; internal/cli implements it on internal/catalog and the
// remote endpoints. Options.Puller lets /pull download models in the
// background (internal/hub). With
// Options.Closer the chat owns its engines and closes each one once it is
// done with it; a model on a GPU (ModelInfo.DeviceMemory) it closes before
// loading one that does not fit beside it (LoadOptions.KeepDevice,
// ErrNoRoom), and loads it back if that one fails.
//
// # Structure
//
// There is one bubbletea model (model.go). Its parts are plain structs that
// it drives and that have no Update of their own: chatTab (one open chat:
// its Chat, its chatView and its replies in flight, tabs.go), chatView (the
// scrollable conversation, chatview.go), input (the textarea and its
// history), completion (the slash-command popup) and statusBar. The model
// embeds the shown chatTab, so m.chat and m.view are the shown chat's;
// code that handles a reply uses the reply's own tab, which may be in the
// background. Update is split by concern: update_keys.go (keys, mouse,
// slash-command dispatch), update_stream.go (sending, streaming,
// rendering, saving), commands_run.go (the slash commands), tabs.go
// (several chats), regen.go (/regen's alternatives), models.go (/models,
// /model and engine hand-over), pull.go (/pull), history.go (the input history on disk).
// Keys live in keys.go (KeyMap), styles in styles.go (Styles, built from a
// Palette; NO_COLOR gives a colourless one). All message types are
// declared in one block in model.go.
//
// # Rules
//
//   - Update does no IO and no slow work. Engine calls, glamour rendering,
//     file writes and the clipboard run in commands, which never touch the
//     model: they return a message and Update applies it.
//   - A reply is pulled one event per command (waitForEvent), re-issued by
//     Update after every delta; the runtime merges deltas while the UI is
//     busy, so the UI never falls behind. Every reply in flight, in any
//     chat, is a generation in model.gens under its own id; events of a
//     reply that was stopped and forgotten (/clear, /load, /close, a kept
//     alternative) find no generation and are dropped.
//   - Several chats generate at once: each Send is one more request the
//     runtime batches. Replies of a chat in the background are rendered
//     when it is shown. One stats poll runs while anything is in flight.
//   - /regen N sends N requests at once (seeds seed+1…seed+N when the
//     chat has a seed) and shows them, with the previous reply, as one
//     choice in the reply's place; the conversation keeps the previous
//     reply until one is kept, so autosaves stay whole.
//   - /model loads in a command (Models.Find, then Models.Load, whose
//     stages come through a channel read like a reply's events). New
//     replies go to the new engine once it is ready; replies still on the
//     old one finish there, and it is closed (in a command) when none is
//     left. A failed load changes nothing.
//   - Text from the model or the user is made printable before it is laid
//     out (printable): control characters are shown, never sent to the
//     terminal.
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
//   - A message that could not be sent goes back to the input as
//     "restored" text (input.restore): typing replaces it, editing keys
//     keep it. The textarea turns tabs into spaces, so the input holds a
//     tab as a private-use rune (tabRune) and converts at its edges.
//   - /model N is entry N of the list /models shows (modelList: the
//     catalog's models, then those the chat opened by folder); the
//     completion popup resolves a number the same way.
//
// # Chats and history on disk
//
// Every chat is saved after each message to
// $XDG_DATA_HOME/ferrite/chats/<id>.json (or the /save name), written
// atomically: a temporary file in the same directory, fsync, rename, and
// an fsync of the directory. Saves carry a sequence number, so a slow save
// never overwrites a newer one. The JSON (Chat) is complete: model,
// system prompt, settings, and every message with its time and, for
// replies, statistics (with the limit that cut a reply) and the settings it
// was sampled with, and the system prompts set mid-chat (SystemChanges);
// /load and UnmarshalChat read it back, by name or from an exported file's
// path. /export md writes the same chat as Markdown. /clear saves the chat
// once more under its name and goes on under a new id, so that the cleared
// conversation can be loaded again.
// The input history is appended to $XDG_DATA_HOME/ferrite/history, one
// JSON string per line (DefaultHistoryFile), and read back at start.
//
// # Testing
//
// Program tests drive the whole model with teatest against a scripted fake
// engine; golden files in testdata/ hold whole screens at a fixed size with
// no colour profile (go test ./ui/ -update regenerates them). Tests on the
// real runtime use a tiny random-weight Qwen3 with the Qwen3 tokenizer.
package ui
