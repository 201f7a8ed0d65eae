// Package gguf reads GGUF files, the single-file model format of llama.cpp
// (and of the models ollama, LM Studio and `llama-cli -hf` download), and
// serves them to the engine like a Hugging Face checkpoint.
//
// The reader is written here rather than imported: the GGUF parsers on the
// Go module proxy either wrap llama.cpp through cgo or pull in large
// dependency trees, while the format is small (a header, typed key-value
// metadata, tensor descriptors and aligned tensor data) and ferrite needs
// more validation than they offer.
//
// Parse validates a whole file up front against its size: every count,
// string length, array length, tensor shape and data offset, with overflow
// checks, so that a truncated download or a lying header is an error naming
// what is wrong (ErrTruncated, ErrCount, ErrString, ErrOffset, ErrOverflow,
// ...) and never a panic or an out-of-range read later. Metadata values are
// kept as views into the file and decoded when asked for.
//
// Open memory-maps a file (and the other parts of a split model named
// NAME-00001-of-00003.gguf) read-only; tensors are used in place as
// kernels.Mat views. Model.Config turns llama.cpp's metadata
// (general.architecture and the "<arch>.*" keys) into the config.json
// ferrite's architectures read, Model.Weights maps the Hugging Face tensor
// names the models ask for onto GGUF names (undoing the Q/K row permutation
// of llama GGUFs and the other changes llama.cpp's converter makes), and
// Model.Tokenizer builds the tokenizer (byte-level BPE or SentencePiece)
// and chat template of tokenizer.ggml.* and tokenizer.chat_template.
package gguf
