package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const llama = `{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 4096,
  "num_hidden_layers": 32,
  "max_position_embeddings": 1e5,
  "intermediate_size": 14336.0,
  "big": 9007199254740993,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "eos_token_id": [128001, 128008, 128009],
  "layer_types": ["full_attention", "sliding_attention"],
  "factors": [1, 2.5, -3e-2],
  "bos_token_id": null,
  "head_dim": 1.5,
  "name": 7,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "linear_attn_config": {"num_heads": 32, "kda_layers": [1, 2, 3], "short_conv_kernel_size": "4"},
  "torch_dtype": "bfloat16"
}`

func mustParse(t *testing.T, text string) *Config {
	t.Helper()
	c, err := Parse("config.json", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGetters(t *testing.T) {
	c := mustParse(t, llama)
	if c.ModelType != "llama" || c.Arch != "LlamaForCausalLM" || c.WrapperType != "" || c.Dtype() != "bfloat16" {
		t.Fatalf("ModelType %q Arch %q WrapperType %q Dtype %q", c.ModelType, c.Arch, c.WrapperType, c.Dtype())
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"Int", c.Int("hidden_size"), 4096},
		{"Int 1e5", c.Int("max_position_embeddings"), 100000},
		{"Int 14336.0", c.Int("intermediate_size"), 14336},
		{"Int beyond 2^53", c.Int("big"), 9007199254740993},
		{"IntOr present", c.IntOr("num_hidden_layers", 7), 32},
		{"IntOr absent", c.IntOr("num_experts", 7), 7},
		{"IntOr null", c.IntOr("bos_token_id", 1), 1},
		{"Float", c.Float("rms_norm_eps"), 1e-5},
		{"Float of an int", c.Float("hidden_size"), 4096.0},
		{"FloatOr absent", c.FloatOr("dropout", 0.5), 0.5},
		{"Bool", c.Bool("tie_word_embeddings"), false},
		{"BoolOr absent", c.BoolOr("use_qk_norm", true), true},
		{"String", c.String("hidden_act"), "silu"},
		{"StringOr absent", c.StringOr("pad", "x"), "x"},
		{"Ints", c.Ints("eos_token_id"), []int{128001, 128008, 128009}},
		{"Ints null", c.Ints("bos_token_id"), []int(nil)},
		{"Strings", c.Strings("layer_types"), []string{"full_attention", "sliding_attention"}},
		{"Floats", c.Floats("factors"), []float64{1, 2.5, -0.03}},
		{"Has", c.Has("hidden_size"), true},
		{"Has null", c.Has("bos_token_id"), false},
		{"Has absent", c.Has("nope"), false},
		{"Raw", c.Raw("rope_scaling"), map[string]any{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0, "rope_type": "llama3"}},
		{"Raw array", c.Raw("eos_token_id"), []any{128001.0, 128008.0, 128009.0}},
		{"Raw absent", c.Raw("nope"), nil},
		{"Sub Int", c.Sub("linear_attn_config").Int("num_heads"), 32},
		{"Sub Ints", c.Sub("linear_attn_config").Ints("kda_layers"), []int{1, 2, 3}},
		{"Sub absent", c.Sub("nope").Has("x"), false},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %#v, want %#v", ch.name, ch.got, ch.want)
		}
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err = %v", err)
	}
}

func TestGetterErrors(t *testing.T) {
	cases := []struct {
		name string
		get  func(c *Config) any
		zero any
		want string
	}{
		{"missing Int", func(c *Config) any { return c.Int("num_experts") }, 0, `config.json: missing key "num_experts"`},
		{"null Int", func(c *Config) any { return c.Int("bos_token_id") }, 0, `config.json: key "bos_token_id" is null`},
		{"fractional Int", func(c *Config) any { return c.Int("head_dim") }, 0, `config.json: key "head_dim" is a number (1.5), want an integer`},
		{"string as Int", func(c *Config) any { return c.Int("hidden_act") }, 0, `config.json: key "hidden_act" is a string ("silu"), want an integer`},
		{"array as Int", func(c *Config) any { return c.Int("eos_token_id") }, 0, `config.json: key "eos_token_id" is an array, want an integer`},
		{"wrong IntOr", func(c *Config) any { return c.IntOr("hidden_act", 5) }, 5, `config.json: key "hidden_act" is a string ("silu"), want an integer`},
		{"number as String", func(c *Config) any { return c.String("name") }, "", `config.json: key "name" is a number (7), want a string`},
		{"bool as Float", func(c *Config) any { return c.Float("tie_word_embeddings") }, 0.0, `config.json: key "tie_word_embeddings" is a bool (false), want a number`},
		{"string as Bool", func(c *Config) any { return c.BoolOr("hidden_act", true) }, true, `config.json: key "hidden_act" is a string ("silu"), want a bool`},
		{"missing Ints", func(c *Config) any { return c.Ints("mrope_section") }, []int(nil), `config.json: missing key "mrope_section"`},
		{"Ints element", func(c *Config) any { return c.Ints("layer_types") }, []int(nil), `config.json: key "layer_types[0]" is a string ("full_attention"), want an integer`},
		{"Strings of a string", func(c *Config) any { return c.Strings("hidden_act") }, []string(nil), `config.json: key "hidden_act" is a string ("silu"), want an array of strings`},
		{"Floats element", func(c *Config) any { return c.Floats("layer_types") }, []float64(nil), `config.json: key "layer_types[0]" is a string ("full_attention"), want a number`},
		{"Sub missing key", func(c *Config) any { return c.Sub("linear_attn_config").Int("head_dim") }, 0, `config.json: missing key "linear_attn_config.head_dim"`},
		{"Sub wrong type", func(c *Config) any { return c.Sub("linear_attn_config").Int("short_conv_kernel_size") }, 0, `config.json: key "linear_attn_config.short_conv_kernel_size" is a string ("4"), want an integer`},
		{"Sub of a non-object", func(c *Config) any { return c.Sub("hidden_size").Has("x") }, false, `config.json: key "hidden_size" is a number (4096), want an object`},
		{"nested Sub", func(c *Config) any { return c.Sub("rope_scaling").Sub("x").Int("y") }, 0, `config.json: missing key "rope_scaling.x.y"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, llama)
			if got := tc.get(c); !reflect.DeepEqual(got, tc.zero) {
				t.Errorf("got %#v, want %#v", got, tc.zero)
			}
			if err := c.Err(); err == nil || err.Error() != tc.want {
				t.Errorf("Err = %v\nwant  %s", err, tc.want)
			}
		})
	}

	// The first problem is kept; every problem is listed.
	c := mustParse(t, llama)
	c.Int("a")
	c.Sub("linear_attn_config").String("b")
	c.Int("hidden_size")
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), `"a"`) || len(c.Errs()) != 2 {
		t.Errorf("Err = %v, Errs = %v", err, c.Errs())
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"syntax", "{\n  \"a\": 1,\n  \"b\": ,\n}", "cfg/config.json:3:"},
		{"trailing comma", "{\"a\": 1,\n}", "cfg/config.json:2:"},
		{"truncated", "{\n\"a\": [1,", "cfg/config.json:2:"},
		{"empty", "", "cfg/config.json:1:1: invalid JSON: unexpected end of file"},
		{"array", "[1]", "cfg/config.json: the top level is a JSON array, want an object"},
		{"null", "null", "cfg/config.json: the top level is null, want an object"},
		{"two objects", "{} {}", "cfg/config.json: data after the JSON object"},
		{"bad text_config", `{"text_config": 3}`, `cfg/config.json: key "text_config" is a number (3), want an object`},
		{"bad model_type", `{"model_type": 3}`, `cfg/config.json: key "model_type" is a number (3), want a string`},
		{"bad architectures", `{"architectures": "Llama"}`, `cfg/config.json: key "architectures" is a string ("Llama"), want an array of strings`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("cfg/config.json", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(llama), 0o644)
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path != filepath.Join(dir, "config.json") || c.Int("hidden_size") != 4096 {
		t.Fatalf("Path %q", c.Path)
	}
	c.Int("missing")
	if err := c.Err(); err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "config.json")+": missing key") {
		t.Errorf("Err = %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("Load of an empty dir: %v", err)
	}
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "config.json"), []byte("{\n\n  \"x\": tru\n}"), 0o644)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), filepath.Join(bad, "config.json")+":3:") {
		t.Errorf("Load of bad JSON: %v", err)
	}
}

func TestTextConfigWrapper(t *testing.T) {
	cases := []struct {
		name, text          string
		model, wrapper, arc string
	}{
		{"nested model_type", `{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
			"text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "vocab_size": 262208},
			"vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
			"hidden_size": 99, "image_token_index": 262144, "vocab_size": null}`,
			"gemma3_text", "gemma3", "Gemma3ForConditionalGeneration"},
		{"no nested model_type", `{"model_type": "llava", "text_config": {"hidden_size": 2560, "vocab_size": 262208},
			"image_token_index": 262144}`, "llava", "llava", ""},
		{"null text_config", `{"model_type": "qwen3", "text_config": null, "hidden_size": 2560, "vocab_size": 262208,
			"image_token_index": 262144}`, "qwen3", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.text)
			if c.ModelType != tc.model || c.WrapperType != tc.wrapper || c.Arch != tc.arc {
				t.Fatalf("ModelType %q WrapperType %q Arch %q", c.ModelType, c.WrapperType, c.Arch)
			}
			// text_config wins; the top level is still visible.
			if c.Int("hidden_size") != 2560 || c.Int("vocab_size") != 262208 || c.Int("image_token_index") != 262144 {
				t.Errorf("hidden_size %d vocab_size %d image_token_index %d", c.Int("hidden_size"), c.Int("vocab_size"), c.Int("image_token_index"))
			}
			if tc.wrapper != "" {
				if top := c.Top(); top.ModelType != tc.wrapper || top.Has("vocab_size") {
					t.Errorf("Top: ModelType %q, vocab_size %v", top.ModelType, top.Raw("vocab_size"))
				}
			}
			if err := c.Err(); err != nil {
				t.Error(err)
			}
		})
	}
	c := mustParse(t, cases[0].text)
	if v := c.Sub("vision_config"); v.ModelType != "siglip_vision_model" || v.Int("hidden_size") != 1152 {
		t.Errorf("vision_config: %q %d", v.ModelType, v.Int("hidden_size"))
	}
}

func TestRope(t *testing.T) {
	def := RopeParams{Theta: 10000, Type: "default", Factor: 1, LowFreqFactor: 1, HighFreqFactor: 4,
		BetaFast: 32, BetaSlow: 1, Truncate: true, PartialRotaryFactor: 1}
	with := func(f func(*RopeParams)) RopeParams {
		r := def
		f(&r)
		return r
	}
	cases := []struct {
		name, text, layer string
		want              RopeParams
	}{
		{"none", `{}`, "", def},
		{"top-level theta", `{"rope_theta": 1e6, "rope_scaling": null}`, "", with(func(r *RopeParams) { r.Theta = 1e6 })},
		{"llama3 rope_scaling", `{"rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}}`, "",
			with(func(r *RopeParams) { r.Theta, r.Type, r.Factor, r.OriginalMaxPos = 500000, "llama3", 8, 8192 })},
		{"legacy type key", `{"rope_scaling": {"type": "linear", "factor": 2}}`, "",
			with(func(r *RopeParams) { r.Type, r.Factor = "linear", 2 })},
		{"transformers 5 rope_parameters", `{"rope_parameters": {"rope_type": "yarn", "rope_theta": 150000, "factor": 32,
			"beta_fast": 32, "beta_slow": 1, "truncate": false, "original_max_position_embeddings": 4096}, "rope_theta": 1}`, "",
			with(func(r *RopeParams) {
				r.Type, r.Theta, r.Factor, r.Truncate, r.OriginalMaxPos = "yarn", 150000, 32, false, 4096
			})},
		{"deepseek yarn", `{"rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
			"mscale": 1.0, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"}}`, "",
			with(func(r *RopeParams) {
				r.Type, r.Factor, r.MScale, r.MScaleAllDim, r.OriginalMaxPos = "yarn", 40, 1, 0.707, 4096
			})},
		{"partial rotary", `{"partial_rotary_factor": 0.25, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}}`, "",
			with(func(r *RopeParams) { r.PartialRotaryFactor, r.Theta = 0.25, 1e7 })},
		{"partial rotary in rope_parameters", `{"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor": 1}`, "",
			with(func(r *RopeParams) { r.PartialRotaryFactor = 0.5 })},
		{"rotary_pct", `{"rotary_pct": 0.25, "rotary_emb_base": 10000}`, "",
			with(func(r *RopeParams) { r.PartialRotaryFactor = 0.25 })},
		{"longrope su", `{"original_max_position_embeddings": 4096, "rope_scaling": {"type": "su",
			"short_factor": [1, 1.5], "long_factor": [2, 3.5]}}`, "",
			with(func(r *RopeParams) {
				r.Type, r.OriginalMaxPos, r.ShortFactor, r.LongFactor = "longrope", 4096, []float64{1, 1.5}, []float64{2, 3.5}
			})},
		{"mrope", `{"rope_theta": 1000000.0, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}`, "",
			with(func(r *RopeParams) { r.Theta, r.MRopeSection = 1e6, []int{16, 24, 24} })},
		{"mrope interleaved", `{"rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": true}}`, "",
			with(func(r *RopeParams) { r.Theta, r.MRopeSection, r.MRopeInterleaved = 5e6, []int{24, 20, 20}, true })},
	}
	perLayer := `{"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
		"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}`
	cases = append(cases,
		struct {
			name, text, layer string
			want              RopeParams
		}{"per layer type: full", perLayer, "full_attention", with(func(r *RopeParams) { r.Type, r.Factor, r.Theta = "linear", 8, 1e6 })},
		struct {
			name, text, layer string
			want              RopeParams
		}{"per layer type: sliding", perLayer, "sliding_attention", def},
		struct {
			name, text, layer string
			want              RopeParams
		}{"per layer type: Rope()", perLayer, "", with(func(r *RopeParams) { r.Type, r.Factor, r.Theta = "linear", 8, 1e6 })},
		struct {
			name, text, layer string
			want              RopeParams
		}{"text_config wrapper", `{"model_type": "qwen2_5_vl", "text_config": {"rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}}`, "",
			with(func(r *RopeParams) { r.Theta, r.MRopeSection = 1e6, []int{16, 24, 24} })},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.text)
			got := c.Rope()
			if tc.layer != "" {
				got = c.RopeFor(tc.layer)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if err := c.Err(); err != nil {
				t.Error(err)
			}
		})
	}
	c := mustParse(t, `{"rope_scaling": {"factor": "eight"}}`)
	c.Rope()
	if err := c.Err(); err == nil || err.Error() != `config.json: key "rope_scaling.factor" is a string ("eight"), want a number` {
		t.Errorf("Err = %v", err)
	}
}

// RopeHas finds a key wherever Rope reads it, and nowhere else.
func TestRopeHas(t *testing.T) {
	for text, want := range map[string]bool{
		`{"partial_rotary_factor": 0.5}`:                      true,
		`{"rope_parameters": {"partial_rotary_factor": 0.5}}`: true,
		`{"rope_scaling": {"partial_rotary_factor": 0.5}}`:    true,
		`{"rope_scaling": {"factor": 2}, "rotary_pct": 0.5}`:  false,
		`{"partial_rotary_factor": null}`:                     false,
	} {
		if got := mustParse(t, text).RopeHas("partial_rotary_factor"); got != want {
			t.Errorf("%s: RopeHas = %v, want %v", text, got, want)
		}
	}
}

func TestConcurrentGetters(t *testing.T) {
	c := mustParse(t, llama)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c.Int("hidden_size")
			c.Int("missing")
			c.Sub("linear_attn_config").Ints("kda_layers")
			c.Rope()
			c.Err()
		})
	}
	wg.Wait()
	if len(c.Errs()) != 8 {
		t.Errorf("%d errors recorded, want 8", len(c.Errs()))
	}
}
