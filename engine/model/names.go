package model

import (
	"regexp"
	"strconv"
	"strings"
)

// reLayer is a layer's index in a tensor's name.
var reLayer = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

// MTPWeight reports whether the checkpoint tensor name belongs to a
// multi-token-prediction module: under mtp., or in a layer at or past
// layers, the main stack's depth (Info().Layers; 0: unknown, no layer
// counts).
func MTPWeight(name string, layers int) bool {
	if strings.HasPrefix(name, "mtp.") || strings.Contains(name, ".mtp.") {
		return true
	}
	if m := reLayer.FindStringSubmatch(name); m != nil && layers > 0 {
		i, _ := strconv.Atoi(m[1])
		return i >= layers
	}
	return false
}

// OutputHead reports whether the checkpoint tensor name is the main
// stack's output head (lm_head.weight, not an MTP module's): a checkpoint
// holding one does not tie its input embedding to the head.
func OutputHead(name string, layers int) bool {
	return strings.HasSuffix(name, "lm_head.weight") && !MTPWeight(name, layers)
}
