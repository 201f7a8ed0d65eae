// Package config reads a Hugging Face checkpoint's config.json.
//
// A Config is a typed view over the JSON object: the text model's fields are
// looked up by key with Int, Float, Bool, String, Ints, Strings and Floats,
// which record a missing key or a wrong type instead of failing at once, so
// a model's constructor reads every field it needs and then checks Err once;
// the ...Or variants supply a default for a key that is absent or null. JSON
// numbers keep full precision, and integers written as floats (1e5, 4.0) are
// accepted where an integer is wanted.
//
// Vision-language checkpoints nest the text model under "text_config"; Parse
// reads the text model's fields from there (falling back to the top level)
// and keeps the wrapper's model_type in WrapperType. Rope gathers the rotary
// embedding parameters from wherever the config keeps them: the top level,
// "rope_scaling", or transformers 5's "rope_parameters".
package config
