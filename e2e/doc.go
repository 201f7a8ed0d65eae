// Package e2e holds ferrite's end-to-end tests: they build the real binary
// and drive it in a real terminal (tmux), as a person would.
package e2e
