// Package tokenizer turns text into token ids and back, exactly as Hugging
// Face tokenizers does for byte-level BPE models described by tokenizer.json,
// and renders the model's Jinja chat template.
package tokenizer
