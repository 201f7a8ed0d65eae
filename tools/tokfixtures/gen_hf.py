#!/usr/bin/env python3
"""Regenerates the tokenizer fixtures with Hugging Face tokenizers/transformers.

Run from the repository root, offline (see README.md):

    OUT=/tmp/tokout python3 tools/tokfixtures/gen_hf.py

Reads tokenizer/testdata/{qwen3,gpt2}/ and tools/tokfixtures/cases.py, writes
to $OUT:

    gpt2_tokenizer.json        GPT-2 tokenizer.json built by `tokenizers` from
                               encoder.json + vocab.bpe
    sp_tokenizer.json          a small SentencePiece-style BPE (byte fallback,
                               unk, Prepend/Replace normalizer) trained here
    encode_qwen3.json          expected ids/decodes for the real Qwen3 tokenizer
    encode_gpt2.json           the same for GPT-2
    encode_variants.json       the same for patched variants (other normalizers,
                               pre-tokenizers, post-processors, added-token flags)
    chat_template_qwen3.json   apply_chat_template(tokenize=False) texts and ids
    log.txt                    versions and notes

Copy them into tokenizer/testdata/ with tools/tokfixtures/install.sh.
"""

import copy
import gzip
import json
import os
import random
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

OUT = os.environ.get("OUT") or "/tmp/tokout"
os.makedirs(OUT, exist_ok=True)
TD = "tokenizer/testdata"
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def dump(name, obj):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def read_gz_text(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- GPT-2 build


def build_gpt2():
    vocab = json.loads(read_gz_text(f"{TD}/gpt2/encoder.json.gz"))
    lines = read_gz_text(f"{TD}/gpt2/vocab.bpe.gz").split("\n")
    merges = []
    for ln in lines:
        if ln.startswith("#version") or ln == "":
            continue
        a, b = ln.split(" ")
        merges.append((a, b))
    bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tok = Tokenizer(bpe)
    # The layout of Hugging Face's own gpt2 tokenizer.json.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=True,
                                       single_word=False, lstrip=False, rstrip=False)])
    s = tok.to_str(pretty=True)
    with open(os.path.join(OUT, "gpt2_tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(s)
    log("gpt2: vocab", tok.get_vocab_size(with_added_tokens=True), "merges", len(merges))
    # Second opinion: transformers' own GPT2 tokenizer class from the same files.
    try:
        import transformers
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        t2 = transformers.GPT2TokenizerFast(vocab_file=os.path.join(d, "vocab.json"),
                                            merges_file=os.path.join(d, "merges.txt"))
        j1 = json.loads(s)
        j2 = json.loads(t2.backend_tokenizer.to_str())
        for k in ["normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"]:
            if j1.get(k) != j2.get(k):
                log("gpt2: transformers GPT2TokenizerFast differs in", k, json.dumps(j2.get(k))[:300])
        m1, m2 = j1["model"], j2["model"]
        log("gpt2: model equal to transformers':", m1 == m2,
            {k: m2[k] for k in m2 if k not in ("vocab", "merges")})
    except Exception as e:  # noqa: BLE001
        log("gpt2: transformers comparison failed:", repr(e))
    return s


# --------------------------------------------------------- SentencePiece-like


def build_sp(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    d = json.loads(tok.to_str())
    voc = d["model"]["vocab"]
    n = max(voc.values()) + 1
    for b in range(256):
        if b == 0xF0:  # leave one out so that 4-byte characters fall back to <unk>
            continue
        key = "<0x%02X>" % b
        if key not in voc:
            voc[key] = n
            n += 1
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    bos = voc["<s>"]
    d["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}},
    }
    tok = Tokenizer.from_str(json.dumps(d))
    s = tok.to_str(pretty=True)
    with open(os.path.join(OUT, "sp_tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(s)
    log("sp: vocab", tok.get_vocab_size(with_added_tokens=True))
    return s


# ------------------------------------------------------------------ variants


def apply_patch(base, patch):
    """Must match applyPatch in tokenizer/fixtures_test.go."""
    d = copy.deepcopy(base)
    for k, v in patch.items():
        if k == "model":
            d["model"].update(v)
        elif k == "added_tokens_append":
            d["added_tokens"].extend(v)
        else:
            d[k] = v
    return d


LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DEEPSEEK_RES = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def variant_defs():
    bl_noregex = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tp = lambda first, last, ids: {  # noqa: E731
        "type": "TemplateProcessing",
        "single": ([{"SpecialToken": {"id": first, "type_id": 0}}] if first else [])
        + [{"Sequence": {"id": "A", "type_id": 0}}]
        + ([{"SpecialToken": {"id": last, "type_id": 0}}] if last else []),
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {k: {"id": k, "ids": [v], "tokens": [k]} for k, v in ids.items()},
    }
    extra_q = [
        "<mask> x  <mask>y\t<mask>", "a[SW]b [SW] c [SW]\n[SW]", "<rs>   z <rs>\n\nw", "A\u030angstro\u0308m and \u00c5ngstr\u00f6m",
        "<|im_start|>assistant\n<|im_start|>user", "  <mask>  <rs>  ", "x123456789y 1234 12", "Don'T WE'LL",
    ]
    extra_g = ["HELLO World 123 45", "<|ENDOFTEXT|> <|endoftext|>x", "  Leading and Trailing  ", "Caf\u00e9 \u00c9COLE"]
    extra_sp = ["Hello world", "  two  spaces ", "emoji \U0001f600 and \u4e2d\u6587", "", " ", "<s> inside </s>", "\u2581already"]
    return [
        {"name": "qwen3_llama3", "base": "qwen3", "extra": extra_q, "patch": {
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Isolated", "invert": False}, bl_noregex]},
            "model": {"ignore_merges": True},
            "post_processor": tp("<|endoftext|>", "<|im_end|>", {"<|endoftext|>": 151643, "<|im_end|>": 151645}),
            "added_tokens_append": [
                {"id": 151669, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False, "special": True},
                {"id": 151670, "content": "[SW]", "single_word": True, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
                {"id": 151671, "content": "<rs>", "single_word": False, "lstrip": False, "rstrip": True, "normalized": False, "special": False},
                {"id": 151672, "content": "\u00c5ngstr\u00f6m", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
                {"id": 151673, "content": "<|im_start|>assistant", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
            ]}},
        {"name": "qwen3_deepseek", "base": "qwen3", "extra": extra_q, "patch": {
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFKC"},
                {"type": "Replace", "pattern": {"String": "\t"}, "content": "    "},
                {"type": "Replace", "pattern": {"Regex": "\r\n"}, "content": "\n"},
                {"type": "Strip", "strip_left": False, "strip_right": True}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in DEEPSEEK_RES
            ] + [bl_noregex]}}},
        {"name": "gpt2_prefix", "base": "gpt2", "extra": extra_g, "patch": {
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
            "post_processor": {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256], "cls": ["<|endoftext|>", 50256],
                               "trim_offsets": True, "add_prefix_space": True}}},
        {"name": "gpt2_split_behaviors", "base": "gpt2", "extra": extra_g, "patch": {
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
                {"type": "Split", "pattern": {"Regex": r"\d+"}, "behavior": "Contiguous", "invert": False},
                {"type": "Split", "pattern": {"Regex": r"[,.!?]"}, "behavior": "MergedWithPrevious", "invert": False},
                {"type": "Split", "pattern": {"Regex": r"\n+"}, "behavior": "Removed", "invert": False},
                {"type": "Split", "pattern": {"Regex": r"[a-z]+"}, "behavior": "Isolated", "invert": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}},
        {"name": "sp_bytefallback", "base": "sp", "extra": extra_sp, "patch": {}},
        {"name": "sp_metaspace", "base": "sp", "extra": extra_sp, "patch": {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
            "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
            "model": {"ignore_merges": True, "fuse_unk": False},
            "added_tokens_append": [
                {"id": 2000, "content": "<sep>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False, "special": True}],
        }},
    ]


# ------------------------------------------------------------------ encoding


def encode_case_list():
    out = []
    for name, val in cases.encode_cases():
        if isinstance(val, bytes):
            out.append({"name": name, "bytes_hex": val.hex(), "text": cases.go_text(val)})
        else:
            out.append({"name": name, "text": val})
    return out


def encode_with(tok, case_list, hf_tok=None):
    res = []
    for c in case_list:
        t = c["text"]
        e0 = tok.encode(t, add_special_tokens=False)
        e1 = tok.encode(t, add_special_tokens=True)
        r = dict(c)
        r["ids"] = e0.ids
        r["tokens"] = e0.tokens
        r["ids_special"] = e1.ids
        r["decode"] = tok.decode(e1.ids, skip_special_tokens=False)
        r["decode_skip"] = tok.decode(e1.ids, skip_special_tokens=True)
        if hf_tok is not None:
            ti0 = hf_tok(t, add_special_tokens=False)["input_ids"]
            ti1 = hf_tok(t)["input_ids"]
            if ti0 != e0.ids:
                r["transformers_ids"] = ti0
            if ti1 != e1.ids:
                r["transformers_ids_special"] = ti1
            td = hf_tok.decode(e1.ids)
            if td != r["decode"]:
                r["transformers_decode"] = td
        res.append(r)
    return res


def random_id_seqs(tok, seed, n=40):
    rng = random.Random(seed)
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    # single byte-level characters (ids of the 256 byte tokens, if any)
    from tokenizers.pre_tokenizers import ByteLevel as BL
    alpha = [vocab[c] for c in BL.alphabet() if c in vocab]
    bytefb = [vocab[k] for k in vocab if len(k) == 6 and k.startswith("<0x") and k.endswith(">")]
    specials = sorted(tok.get_added_tokens_decoder().keys())
    seqs = []
    for _ in range(n):
        ln = rng.randint(1, 30)
        s = []
        for _ in range(ln):
            r = rng.random()
            if r < 0.35 and alpha:
                s.append(rng.choice(alpha))
            elif r < 0.55 and bytefb:
                s.append(rng.choice(bytefb))
            elif r < 0.65 and specials:
                s.append(rng.choice(specials))
            else:
                s.append(rng.randrange(size))
        seqs.append(s)
    seqs.append([size + 5, 0])  # unknown id is dropped
    out = []
    for s in seqs:
        out.append({"ids": s, "text": tok.decode(s, skip_special_tokens=False),
                    "text_skip": tok.decode(s, skip_special_tokens=True)})
    return out


def main():
    import transformers
    log("tokenizers", tokenizers.__version__, "transformers", transformers.__version__, "python", sys.version.split()[0])
    from transformers import AutoTokenizer

    qwen_json = read_gz_text(f"{TD}/qwen3/tokenizer.json.gz")
    gpt2_json = build_gpt2()

    # Directories transformers can load.
    qdir = tempfile.mkdtemp()
    with open(os.path.join(qdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(qwen_json)
    with open(f"{TD}/qwen3/tokenizer_config.json", encoding="utf-8") as f:
        qcfg = f.read()
    with open(os.path.join(qdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write(qcfg)
    gdir = tempfile.mkdtemp()
    with open(os.path.join(gdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(gpt2_json)
    with open(f"{TD}/gpt2/tokenizer_config.json", encoding="utf-8") as f:
        gcfg = f.read()
    with open(os.path.join(gdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write(gcfg)

    case_list = encode_case_list()
    toks = {"qwen3": Tokenizer.from_str(qwen_json), "gpt2": Tokenizer.from_str(gpt2_json)}
    for name, d in [("qwen3", qdir), ("gpt2", gdir)]:
        tok = toks[name]
        try:
            hf = AutoTokenizer.from_pretrained(d)
            log(name, "transformers class", type(hf).__name__, "bos", hf.bos_token_id, "eos", hf.eos_token_id,
                "pad", hf.pad_token_id, "len", len(hf))
        except Exception as e:  # noqa: BLE001
            log(name, "AutoTokenizer failed:", repr(e))
            traceback.print_exc()
            hf = None
        res = encode_with(tok, case_list, hf)
        ndiff = sum(1 for r in res if any(k.startswith("transformers_") for k in r))
        log(name, "cases", len(res), "with transformers differences", ndiff)
        dump(f"encode_{name}.json", {
            "tokenizer": name,
            "generator": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "model_vocab_size": tok.get_vocab_size(with_added_tokens=False),
            "cases": res,
            "decode_cases": random_id_seqs(tok, 7 if name == "qwen3" else 11),
        })

    # Variants.
    corpus = [c["text"] for c in case_list if c["text"] and not any(ord(ch) > 0x2FFF for ch in c["text"])]
    corpus += [cases.LONG_EN, cases.PY_CODE, cases.GO_CODE] * 3
    sp_json = build_sp(corpus)
    bases = {"qwen3": json.loads(qwen_json), "gpt2": json.loads(gpt2_json), "sp": json.loads(sp_json)}
    vout = []
    for v in variant_defs():
        d = apply_patch(bases[v["base"]], v["patch"])
        try:
            tok = Tokenizer.from_str(json.dumps(d))
        except Exception as e:  # noqa: BLE001
            log("variant", v["name"], "failed to load:", repr(e))
            continue
        cl = case_list + [{"name": "extra_%d" % i, "text": t} for i, t in enumerate(v["extra"])]
        try:
            res = encode_with(tok, cl)
        except Exception as e:  # noqa: BLE001
            log("variant", v["name"], "failed to encode:", repr(e))
            continue
        log("variant", v["name"], "cases", len(res))
        vout.append({"name": v["name"], "base": v["base"], "patch": v["patch"], "cases": res,
                     "decode_cases": random_id_seqs(tok, len(vout) + 100, 20)})
    dump("encode_variants.json", {"generator": {"tokenizers": tokenizers.__version__}, "variants": vout})

    # Chat templates.
    hfq = AutoTokenizer.from_pretrained(qdir)
    tcs = []
    for tc in cases.template_cases():
        kw = dict(tc["kwargs"])
        tools = kw.pop("tools", None)
        try:
            text = hfq.apply_chat_template(copy.deepcopy(tc["messages"]), tools=copy.deepcopy(tools), tokenize=False, **kw)
            ids = hfq.apply_chat_template(copy.deepcopy(tc["messages"]), tools=copy.deepcopy(tools), tokenize=True, **kw)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
            err = None
        except Exception as e:  # noqa: BLE001
            text, ids, err = None, None, repr(e)
            log("template", tc["name"], "error", err)
        tcs.append({"name": tc["name"], "messages": tc["messages"], "tools": tools,
                    "kwargs": kw, "text": text, "ids": ids, "error": err})
    log("template cases", len(tcs))
    dump("chat_template_qwen3.json", {"generator": {"transformers": transformers.__version__},
                                      "template_source": "tokenizer_config.json chat_template", "cases": tcs})


if __name__ == "__main__":
    try:
        main()
    finally:
        with open(os.path.join(OUT, "log.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(LOG) + "\n")
