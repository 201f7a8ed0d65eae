// Package tokenizer turns text into token ids and back, exactly as Hugging
// Face tokenizers does for byte-level BPE models described by tokenizer.json,
// and renders the model's Jinja chat template.
//
// # Loading
//
// Load reads a model directory: tokenizer.json (or tokenizer.json.gz),
// tokenizer_config.json (bos/eos/pad/unk tokens, add_bos_token,
// add_eos_token, clean_up_tokenization_spaces, chat_template),
// chat_template.jinja (transformers 5 saves the template there; it wins over
// the config's) and generation_config.json (its eos_token_id ids are added
// to EOS). Errors name the file and what is wrong; a malformed file gives an
// error, never a panic.
//
// # Encoding
//
// Encode follows the tokenizers pipeline:
//
//  1. added tokens (special or not) are cut out of the text, leftmost-longest,
//     honouring single_word, lstrip, rstrip; tokens with normalized=true are
//     matched after normalization. As in tokenizers, the ids written in
//     added_tokens are only hints: a token already in the model vocab keeps
//     that id, others get the next ids after the vocab, in file order;
//  2. normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents,
//     Replace (string or regex), Prepend, ByteLevel, Sequence;
//  3. pre-tokenizers: Split (string or regex pattern, all five behaviors,
//     invert), ByteLevel (add_prefix_space, use_regex), Digits, Metaspace
//     (prepend_scheme always/first/never, split), Whitespace,
//     WhitespaceSplit, Punctuation, BertPreTokenizer, Sequence;
//  4. the BPE model: merges as "a b" strings or [a, b] pairs, merge ranks in
//     a map and a heap-driven merge loop, ignore_merges, byte_fallback
//     (<0xXX> tokens), unk_token with fuse_unk, continuing_subword_prefix,
//     end_of_word_suffix, and a cache of word -> ids;
//  5. with addSpecial, the post-processor: TemplateProcessing,
//     RobertaProcessing, BertProcessing, ByteLevel, Sequence. When
//     tokenizer_config.json says add_bos_token (add_eos_token) and the
//     post-processor did not put that token there, it is added, as
//     transformers does for Llama-style tokenizers.
//
// The pre-tokenizer regexes of GPT-2, Llama 3 and Qwen 2/3 use a lookahead
// (\s+(?!\S)) that Go's regexp lacks; they are matched by hand-written code
// that reproduces Oniguruma's backtracking exactly (\s is Unicode
// White_Space, \p{L} and \p{N} Unicode categories, the (?i) contractions fold
// ASCII only). Any other regex runs on github.com/dlclark/regexp2.
//
// Go strings may hold invalid UTF-8, which Python and Rust strings cannot.
// Encode treats every byte that is not part of a valid UTF-8 sequence as
// U+FFFD (one replacement per byte, as a Go range loop sees the string), so
// the ids are those Hugging Face gives for that repaired text.
//
// # Decoding
//
// Decode skips unknown ids (and special tokens when asked), runs the
// decoders (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
// BPEDecoder, Sequence) and, when the config asks for it, transformers'
// clean_up_tokenization. Bytes that do not form valid UTF-8 become U+FFFD,
// one per maximal invalid subsequence, as Rust's String::from_utf8_lossy
// does.
//
// A StreamDecoder (NewStreamDecoder, Add, Flush) decodes generated ids one
// at a time. Every piece it returns is valid UTF-8 and the pieces add up to
// Decode of all the ids. For ByteLevel decoders it holds back the bytes of
// an incomplete character and costs O(1) per id; for other decoders it
// re-decodes the ids so far and holds back text that a later id could still
// change, which costs O(n) per id.
//
// # Chat templates
//
// ApplyChatTemplate renders the template with a copy of
// github.com/ardanlabs/jinja v1.8.0 in internal/jinja (chosen by measuring Go
// Jinja libraries byte for byte against Python jinja2 as transformers
// configures it; copied to add resource limits, see below), with the
// variables transformers passes: messages, tools (None when there are none),
// add_generation_prompt, the special tokens (bos_token, eos_token,
// pad_token, unk_token), enable_thinking when set, and extra variables.
// JSON (tools, tool-call arguments, json.RawMessage variables) keeps its key
// order, since tojson prints keys in order as Python does.
//
// Templates come with downloaded models, so they are sandboxed: the library
// has no include/import/extends, so a template cannot read files, and a
// rendering is bounded in time and memory, even inside one expression:
//   - it runs in its own goroutine and fails after TemplateOptions.Timeout
//     (2 s by default); the renderer checks the deadline every 16
//     evaluation steps, so the goroutine ends soon after too;
//   - no single operation builds a string over 64 MiB or a list of over 2
//     million items (string repetition, concatenation, replace, format,
//     indent, join, tojson, printing a list, list(), split()): it fails
//     before allocating; the output is at most MaxTemplateOutput (16 MiB),
//     and the values one rendering builds in all at most 512 MiB;
//   - comparisons visit at most a million values, and printing a list or
//     dict that holds itself fails, so neither runs away;
//   - range() is limited to 100000 items (Jinja's sandbox MAX_RANGE); loop
//     iterations and macro calls are counted (10 million at most) and macro
//     calls limited to 5000, which bounds recursion depth (a stack overflow
//     would kill the process), as does a limit of 500 on bracket nesting;
//     the source is at most 1 MiB. The counting works by rewriting the
//     source: each `{% for %}` without a filter gets an always-true
//     `if __ferrite_tick()` filter, and each macro a last parameter whose
//     default calls the guard.
//
// Panics inside the library become errors, and a malformed template gives an
// error naming the template.
//
// What remains:
//   - loops that already have an `if` filter and `recursive` loops are not
//     counted (the deadline and memory limits still hold);
//   - library differences from Python: tojson(indent=N) sorts keys and
//     escapes <, >, & (Llama 3.1+ tool prompts use it); a macro default
//     value holding a comma ("a, b") is split wrongly; undefined a.b.c is ""
//     where Python raises.
//
// # Tests
//
// testdata/ holds the real Qwen3 tokenizer, GPT-2's BPE (and the
// tokenizer.json Hugging Face tokenizers builds from it), a small trained
// SentencePiece-style BPE, and the ids, decodes and chat-template texts that
// Hugging Face tokenizers 0.23 and transformers 5.17 produce for hard inputs
// and for patched variants of these tokenizers (other normalizers,
// pre-tokenizers, post-processors and added-token flags).
// tools/tokfixtures regenerates them.
package tokenizer
