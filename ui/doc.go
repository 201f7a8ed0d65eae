// Package ui is ferrite's terminal chat: one bubbletea program that runs the
// engine in-process and streams replies into a scrollable, Markdown-rendered
// conversation with live engine statistics.
package ui
