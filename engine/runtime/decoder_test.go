package runtime_test

import (
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// The tokenizer's stream decoder is a TextDecoder, Flush included.
var (
	_ runtime.TextDecoder         = (*tokenizer.StreamDecoder)(nil)
	_ interface{ Flush() string } = (*tokenizer.StreamDecoder)(nil)
)
