"""Input strings and conversations for the tokenizer fixtures.

Imported by gen_hf.py. Each encode case is (name, text) or (name, bytes) for
inputs that are not valid UTF-8: Go strings may hold such bytes, Python and
Rust strings may not. For a bytes case the reference text is the bytes with
every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD, one
replacement per byte, which is what the Go Encode does (see tokenizer/doc.go).
"""

import random

LONG_EN = (
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; "
    "the dog had seen 1,234 foxes since 1999 and didn't care anymore.\n\n"
    "Meanwhile, in the kitchen, someone was baking bread at 220\u00b0C for 35 minutes "
    "-- a recipe they'd found online (https://example.com/bread?id=42&lang=en).\n"
)

PY_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


if __name__ == "__main__":
\tprint(fib(30))  # 832040
'''

GO_CODE = '''package main

import "fmt"

// Sum adds the numbers.
func Sum(xs ...int) (total int) {
\tfor _, x := range xs {
\t\ttotal += x
\t}
\treturn
}

func main() {
\tfmt.Printf("%d\\n", Sum(1, 2, 3))
}
'''

JSON_TEXT = '{"name": "ferrite", "version": 1.0, "tags": ["llm", "go"], "nested": {"a": null, "b": [1, 2, {"c": "d\\n"}]}, "emoji": "\U0001f680"}'

HTML_TEXT = '<div class="x">\n  <p>Hello &amp; welcome!</p>\n  <br/>\n</div>'


def encode_cases():
    c = [
        ("empty", ""),
        ("single_a", "a"),
        ("single_space", " "),
        ("single_newline", "\n"),
        ("single_tab", "\t"),
        ("single_e_acute", "\u00e9"),
        ("single_cjk", "\u4e2d"),
        ("single_emoji", "\U0001f600"),
        ("single_digit", "7"),
        ("single_apostrophe", "'"),
        ("hello_world", "Hello world"),
        ("two_spaces", "hello  world"),
        ("many_spaces", "a          b"),
        ("leading_spaces", "   leading"),
        ("trailing_spaces", "trailing   "),
        ("only_spaces", "     "),
        ("tab_between", "a\tb"),
        ("tabs_only", "\t\t\t"),
        ("mixed_ws", "mixed \t \t x\t "),
        ("space_tab_newline", " \t\n \t\nx"),
        ("nbsp", "a\u00a0b \u00a0c\u00a0\u00a0"),
        ("ideographic_space", "ideographic\u3000space\u3000\u3000x"),
        ("thin_space", "thin\u2009space\u2002en\u2003em"),
        ("nel", "nel\u0085x"),
        ("zero_width", "zw\u200bsp\u200cnj\u200dj\ufeffbom"),
        ("line_sep", "a\u2028b\u2029c"),
        ("vertical_tab_ff", "a\x0bb\x0cc\x1cd\x1fe"),
        ("nl_simple", "a\nb"),
        ("crlf", "a\r\nb\r\n"),
        ("cr_only", "a\rb\r"),
        ("many_newlines", "\n\n\n\n"),
        ("lines_blank", "line1\n\n\nline2\n"),
        ("spaces_then_newline", "x  \n  y"),
        ("newline_spaces_end", "end with spaces \n   "),
        ("cr_nl_mix", "\r\r\n\n\r"),
        ("indent_block", "if x:\n    y\n        z\n"),
        ("digits_long", "1234567890123456789012345678901234567890"),
        ("digits_decimal", "3.14159265358979"),
        ("digits_grouped", "12,345,678.90 and 1 000 000"),
        ("digits_mixed", "x1y22z333w4444"),
        ("arabic_indic_digits", "\u0663\u0664\u0665 and \u0968\u0969"),
        ("super_frac", "x\u00b2 + \u00bd + \u2153 + \u2460"),
        ("fullwidth_digits", "\uff11\uff12\uff13\uff41\uff42"),
        ("roman_numeral", "\u2163 \u216b"),
        ("contractions", "don't I'm we're they've you'll he'd it's"),
        ("contractions_upper", "DON'T I'M WE'RE THEY'VE YOU'LL HE'D IT'S"),
        ("contractions_mixed", "We'Re It'S you'Ll"),
        ("apostrophe_edge", "'s' '' 'sup O'Neil rock'n'roll '"),
        ("apostrophe_long_s", "it'\u017f that'\u017fo"),
        ("apostrophe_curly", "don\u2019t it\u2019s"),
        ("quotes", "\"quoted\" 'single' `back`"),
        ("cjk_zh", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002"),
        ("cjk_ja", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca"),
        ("cjk_ko", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4"),
        ("cjk_mixed", "Hello\u4e16\u754c123abc\u4e2d\u6587"),
        ("emoji_simple", "I \u2764\ufe0f Go \U0001f680\U0001f680"),
        ("emoji_skin", "\U0001f44d\U0001f3fd \U0001f44b\U0001f3ff"),
        ("emoji_zwj_family", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"),
        ("emoji_zwj_flag", "\U0001f3f3\ufe0f\u200d\U0001f308"),
        ("emoji_flags", "\U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7"),
        ("emoji_keycap", "1\ufe0f\u20e3#\ufe0f\u20e3"),
        ("combining_e", "e\u0301 vs \u00e9"),
        ("combining_a_ring", "A\u030a \u212b \u00c5"),
        ("combining_stack", "Z\u0324\u0354\u0367\u0311\u0313a\u0356\u032d\u0308\u0307l\u036e\u0312\u036bo\u0328\u0317\u0359"),
        ("hangul_jamo", "\u1100\u1161\u11a8 \uac01"),
        ("ligature", "\ufb01nd \ufb02ow"),
        ("arabic", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"),
        ("hebrew", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"),
        ("hindi", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e"),
        ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01"),
        ("russian", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!"),
        ("greek", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5"),
        ("vietnamese", "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u"),
        ("math_symbols", "\u2200x\u2208\u211d: x\u00b2 \u2265 0 \u2192 \u221e \u2260 \u2211"),
        ("private_use", "\ue000\uf8ff"),
        ("astral_misc", "\U0001d54f\U0001d55a \U00010348 \U0001f9ea"),
        ("replacement_char", "bad \ufffd char"),
        ("control_chars", "a\x00b\x01c\x7fd"),
        ("special_im", "<|im_start|>user\nhi<|im_end|>\n"),
        ("special_eot", "<|endoftext|>"),
        ("special_in_text", "text<|endoftext|>more text"),
        ("special_twice", "<|endoftext|><|endoftext|>"),
        ("special_spaces_around", " <|im_end|> x <|im_start|> "),
        ("special_partial", "<|im_start| <|endoftext|  |endoftext|> <|im_"),
        ("special_nested", "<<|endoftext|>>"),
        ("special_case", "<|IM_START|> <|Endoftext|>"),
        ("special_spaced", "< |endoftext| >"),
        ("think_tags", "<think>\nreasoning here\n</think>\n\nanswer"),
        ("tool_call_tags", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        ("chatml_full", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"),
        ("code_python", PY_CODE),
        ("code_go", GO_CODE),
        ("code_json", JSON_TEXT),
        ("code_html", HTML_TEXT),
        ("code_shell", "for f in *.go; do\n\tgofmt -l \"$f\" || exit 1\ndone  # check\n"),
        ("regex_like", "^\\s+(?!\\S)|[\\p{L}]+$ \\n \\t"),
        ("url", "https://example.com/path/to/page?query=1&b=two#frag"),
        ("email", "someone.else+tag@example.co.uk"),
        ("long_word", "pneumonoultramicroscopicsilicovolcanoconiosis"),
        ("long_a", "a" * 200),
        ("long_abc", "abc" * 100),
        ("long_digits", "1" * 300),
        ("long_spaces", " " * 100 + "x"),
        ("long_newlines", "\n" * 50),
        ("long_dashes", "-" * 80 + "\n" + "=" * 40),
        ("long_cjk", "\u6f22\u5b57" * 60),
        ("long_emoji", "\U0001f600" * 40),
        ("hex_blob", "0x7f3a9b2c4d5e6f708192a3b4c5d6e7f8"),
        ("base64", "SGVsbG8sIFdvcmxkIQ==aGVsbG8gd29ybGQ="),
        ("punct_runs", "!!!??? ... ,,, ;;; ::: ((( ))) [[[ ]]]"),
        ("punct_newline", "end.\n\nNext!\r\n"),
        ("markdown", "# Title\n\n* item **bold** _it_\n1. one\n\n```go\nx := 1\n```\n> quote"),
        ("paragraph", LONG_EN),
    ]
    out = [(n, t) for n, t in c]
    # Inputs that are not valid UTF-8.
    out += [
        ("invalid_ff", b"\xff"),
        ("invalid_c3_trunc", b"abc\xc3"),
        ("invalid_e282_trunc", b"\xe2\x82 x"),
        ("invalid_surrogate", b"a\xed\xa0\x80b"),
        ("invalid_too_big", b"\xf4\x90\x80\x80"),
        ("invalid_overlong", b"\xc0\xaf/"),
        ("invalid_mid", b"ab\xffcd\xfe ef"),
        ("invalid_lone_cont", b"\x80\x80 \xbf"),
        ("invalid_mixed_valid", b"\xe2\x98\x83\xe2\x98 snow"),
    ]
    # Seeded random mixtures of scripts, whitespace, digits and symbols.
    rng = random.Random(20260601)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 8 + "\t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "\u00e9\u00fc\u00df\u00f1\u00e7\u0153\u00e6\u00f8",
        "\u4e00\u4e8c\u4e09\u4f60\u597d\u6587\u5b57\u3042\u3044\u30a2",
        "\u0645\u0631\u062d\u0928\u092e\u0e2a\u0e27\u041f\u0440\u03b3",
        "\U0001f600\U0001f44d\U0001f3fd\u200d\u2764\ufe0f\U0001f680",
        "\u0301\u0308\u0327\u00a0\u3000\u2009\u0085",
        ["'s", "'t", "'re", "'LL", "<|im_end|>", "<|endoftext|>", "<think>", "\r\n", "   ", "123"],
    ]
    for i in range(24):
        n = rng.randint(1, 60)
        s = []
        for _ in range(n):
            p = pools[rng.randrange(len(pools))]
            s.append(p[rng.randrange(len(p))])
        out.append(("random_%02d" % i, "".join(s)))
    return out


def go_text(b: bytes) -> str:
    """The string Go's Encode tokenizes for bytes b: each byte outside a valid
    UTF-8 sequence becomes U+FFFD (as in a Go range loop)."""
    s = b.decode("utf-8", errors="surrogateescape")
    return "".join("\ufffd" if 0xDC80 <= ord(ch) <= 0xDCFF else ch for ch in s)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Returns \u00b0C & <html> safe \"text\".",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. M\u00fcnchen or \u6771\u4eac"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 5}},
            "required": ["query"],
        },
    },
}


def template_cases():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "Hello!"}
    a1 = {"role": "assistant", "content": "Hi! How can I help you today?"}
    u2 = {"role": "user", "content": "What is 2+2?"}
    c = []

    def add(name, messages, **kw):
        c.append({"name": name, "messages": messages, "kwargs": kw})

    add("user_only_gen", [u1], add_generation_prompt=True)
    add("user_only_no_gen", [u1], add_generation_prompt=False)
    add("system_user_gen", [sys_msg, u1], add_generation_prompt=True)
    add("multi_turn_gen", [sys_msg, u1, a1, u2], add_generation_prompt=True)
    add("multi_turn_no_gen", [sys_msg, u1, a1], add_generation_prompt=False)
    add("thinking_false", [sys_msg, u1], add_generation_prompt=True, enable_thinking=False)
    add("thinking_true", [u1], add_generation_prompt=True, enable_thinking=True)
    add("thinking_false_no_gen", [u1, a1], add_generation_prompt=False, enable_thinking=False)
    add("think_in_history", [
        u1,
        {"role": "assistant", "content": "<think>\nThe user greets me. I should greet back.\n</think>\n\nHi there!"},
        u2,
    ], add_generation_prompt=True)
    add("think_in_last_assistant", [
        u2,
        {"role": "assistant", "content": "<think>\n2 plus 2 is 4.\n</think>\n\nIt is 4."},
    ], add_generation_prompt=False)
    add("reasoning_content_field", [
        u2,
        {"role": "assistant", "content": "It is 4.", "reasoning_content": "Simple arithmetic: 2+2=4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "3+3=6"},
    ], add_generation_prompt=False)
    add("system_only_gen", [sys_msg], add_generation_prompt=True)
    add("empty_user", [{"role": "user", "content": ""}], add_generation_prompt=True)
    add("unicode_and_jinja_text", [
        sys_msg,
        {"role": "user", "content": "Emoji \U0001f680, CJK \u4f60\u597d, quotes \"'\\ and {{ not_a_var }} {% if x %}raw{% endif %}\nnew line\ttab"},
    ], add_generation_prompt=True, enable_thinking=False)
    add("tools_call", [
        sys_msg,
        {"role": "user", "content": "What's the weather in M\u00fcnchen?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "M\u00fcnchen", "unit": "celsius"}}},
        ]},
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21\u00b0C and clear in M\u00fcnchen."},
    ], add_generation_prompt=False, tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tools_multi_call", [
        {"role": "user", "content": "Weather in Paris and news about it?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Paris news\", \"top_k\": 3}"}},
        ]},
        {"role": "tool", "content": "{\"temp\": 18}"},
        {"role": "tool", "content": "[\"headline 1\", \"headline 2\"]"},
    ], add_generation_prompt=True, tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tools_no_system_gen", [{"role": "user", "content": "Search for Go generics."}],
        add_generation_prompt=True, enable_thinking=False, tools=[SEARCH_TOOL])
    add("multi_step_tool", [
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "content": "<think>\nNeed weather first.\n</think>\n\n", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "<think>\nNow search.\n</think>\n\nSearching.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "Rome sights"}}},
        ]},
        {"role": "user", "content": "<tool_response>\nColosseum\n</tool_response>"},
    ], add_generation_prompt=True, tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("system_late", [u1, a1, {"role": "system", "content": "Be brief."}, u2], add_generation_prompt=True)
    return c
