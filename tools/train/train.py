#!/usr/bin/env python3
"""Train ferrite-tiny: a small glm5_next (KDA + k-pool DSA + mHC + dense/MoE + one NextN MTP layer)
dictionary and quotation companion, with transformers 5.17 / PyTorch on one GPU.

One run does everything, under a wall-clock budget counted from the script's start:

  1. tokenizer: byte-level BPE (HF tokenizers) trained on the corpus, with <|endoftext|>,
     <|im_start|>, <|im_end|> and a ChatML-like chat template; tokenizer test cases for ferrite;
  2. data: every conversation rendered with the template and tokenized; loss only on the
     assistant turns (content + <|im_end|>); packed into rows of --seq tokens that start at a
     conversation boundary;
  3. model: Glm5NextForConditionalGeneration (transformers has no text-only glm5_next class; the
     vision tower is a 1-block stub that is never run) plus a hand-built NextN MTP block under the
     checkpoint's names (model.language_model.layers.L.*), trained jointly:
        loss = CE(next token) + mtp_weight * CE(token after next)
     bf16 autocast, fused AdamW, warmup + cosine schedule over the time budget, aux-loss-free
     expert balancing (DeepSeek-V3's e_score_correction_bias update), checkpoints every
     --ckpt-every seconds (--resume continues from one);
  4. final weights rounded to bf16 and saved with save_pretrained (model.safetensors, config.json,
     generation_config.json) next to the tokenizer files;
  5. reference fixture in float32 on the CPU (prompt/decode/greedy/MTP logits, residual streams)
     in the format of testdata/models (tools/goldens/make_goldens.py's code), and greedy answers
     to a few questions for ferrite's tests;
  6. evaluation on the GPU in float32: greedy answers to held-out and seen words, and the MTP
     layer's greedy draft acceptance.

Typical use on the GPU machine (see MODEL_CARD.md, "Retraining"):

  PYTHONUNBUFFERED=1 python3 tools/train/train.py --corpus tools/train/data/corpus --out /tmp/ft \
      --train-until 380 --eval-deadline 480
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import gzip  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

os.environ.setdefault("USE_HUB_KERNELS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
NAME = "ferrite-tiny"
# chat questions the evaluations ask beside the held-out dictionary ones (train.py, train_mtp.py)
CHAT_QUESTIONS = [
    "Who are you?", "hello", "What can you do?", "Tell me a quote about time.", "Tell me a quote about love.",
    "What is the opposite of hot?", "Give me a synonym for happy.", "Use candid in a sentence.",
    "What does ephemeral mean?", "What is the capital of France?", "Give me a Bible verse about light.",
    "What does the Devil's Dictionary say about lawyer?", "What does hack mean in hacker jargon?",
    "What does blorptic mean?", "thanks!",
]

torch = None
nn = None
F = None
mg = None  # tools/goldens/make_goldens.py as a module


def now():
    return time.time() - T0


def no_grad(fn):
    """torch.no_grad() applied at call time (torch is imported in main)."""

    def wrapped(*a, **k):
        with torch.no_grad():
            return fn(*a, **k)

    wrapped.__name__ = fn.__name__
    return wrapped


def log(msg):
    print(f"[{now():7.1f}s] {msg}", flush=True)


def render(messages, add_generation_prompt=False):
    """The chat template in Python (checked against transformers' rendering at run time)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    if add_generation_prompt:
        s += "<|im_start|>assistant\n"
    return s


def segments(messages):
    """The rendered conversation as [(text, is_target)], targets = assistant content + <|im_end|>."""
    out = []
    buf = ""
    for m in messages:
        if m["role"] == "assistant":
            buf += "<|im_start|>assistant\n"
            out.append((buf, False))
            out.append((m["content"] + "<|im_end|>", True))
            buf = "\n"
        else:
            buf += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    if buf:
        out.append((buf, False))
    return out


# ----------------------------------------------------------------------------
# Model configuration
# ----------------------------------------------------------------------------


def text_kwargs(vocab, args):
    L = 6
    return dict(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.inter,
        moe_intermediate_size=args.moe_inter,
        num_hidden_layers=L,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        n_shared_experts=1,
        n_routed_experts=args.experts,
        routed_scaling_factor=2.5,
        kv_lora_rank=128,
        q_lora_rank=128,
        qk_rope_head_dim=0,
        v_head_dim=64,
        qk_nope_head_dim=64,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        layer_types=[
            "linear_attention", "linear_attention", "deepseek_sparse_attention",
            "linear_attention", "linear_attention", "deepseek_sparse_attention",
        ],
        mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
        index_topk=1024,  # = max_position_embeddings: within the context the indexer keeps every pool
        index_head_dim=32,
        index_n_heads=4,
        index_kpool=4,
        index_kpool_always_select_tail=True,
        swiglu_limit=10.0,
        linear_head_dim=64,
        linear_num_heads=args.heads,
        linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0,
        hc_mult=4,
        hc_eps=1e-6,
        hc_sinkhorn_iters=20,
        num_nextn_predict_layers=1,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


VISION = dict(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=32,
    out_hidden_size=None,  # set to hidden_size
    projection_intermediate_size=64,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    in_channels=3,
)


def build_model(vocab, args):
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    vision = dict(VISION, out_hidden_size=args.hidden)
    cfg = Glm5NextConfig(text_config=text_kwargs(vocab, args), vision_config=vision, tie_word_embeddings=False)
    model = Glm5NextForConditionalGeneration._from_config(
        cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    return model


def build_mtp(model):
    """NextN block with a plain residual stream (no hyper-connections), as in make_goldens.py
    (nextn_plain), with the checkpoint's submodule names."""
    tcfg = mg.text_config(model.config)
    L, H = tcfg.num_hidden_layers, tcfg.hidden_size
    mod = sys.modules[type(model).__module__]
    cfg2 = mg.clone_config(
        tcfg,
        num_hidden_layers=L + 1,
        layer_types=list(tcfg.layer_types) + ["deepseek_sparse_attention"],
        mlp_layer_types=list(tcfg.mlp_layer_types) + ["sparse"],
        indexer_types=list(tcfg.indexer_types) + ["full"],
    )
    rms = mod.Glm5NextTextRMSNorm

    class PlainNextNBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = mod.Glm5NextTextAttention(cfg2, L)
            self.mlp = mod.Glm5NextTextMoE(cfg2)
            self.input_layernorm = rms(H, eps=tcfg.rms_norm_eps)
            self.post_attention_layernorm = rms(H, eps=tcfg.rms_norm_eps)
            self.enorm = rms(H, eps=tcfg.rms_norm_eps)
            self.hnorm = rms(H, eps=tcfg.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * H, H, bias=False)
            self.shared_head = nn.Module()
            self.shared_head.norm = rms(H, eps=tcfg.rms_norm_eps)
            self.shared_head.head = nn.Linear(H, tcfg.vocab_size, bias=False)

        def block(self, x):
            S = x.shape[1]
            h = self.input_layernorm(x)
            h = self.self_attn(
                hidden_states=h,
                attention_mask=torch.ones(x.shape[0], S, dtype=torch.bool, device=x.device),
                past_key_values=None,
            )[0]
            x = x + h
            return x + self.mlp(self.post_attention_layernorm(x))

        def forward(self, emb_next, hidden):
            """emb_next = embed(tok[p+1]), hidden = final_hidden[p]; returns shared_head.norm(x)."""
            x = self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(hidden)], dim=-1))
            return self.shared_head.norm(self.block(x))

    return PlainNextNBlock()


def init_weights(module, std, gen):
    """Initialise every parameter explicitly, following transformers' Glm5NextPreTrainedModel
    _init_weights (some parameters are created with torch.empty): linear / expert / router / mHC fn
    weights N(0, std), norms 1, biases 0, KDA A_log 0 and dt_bias = softplus^-1(U(1e-3, 0.1) in log
    space), short convolutions PyTorch's default, k-pool gate 1 and ape 0, mHC base 0 and scale 1,
    router correction biases 0."""
    with torch.no_grad():
        _init_weights(module, std, gen)


def _init_weights(module, std, gen):
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.zero_()
        elif leaf == "dt_bias":
            u = torch.rand(p.shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)
            dt = u.exp().clamp_min(1e-4)
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif "conv1d" in name and p.dim() == 3:
            bound = 1.0 / math.sqrt(p.shape[1] * p.shape[2])
            p.copy_(torch.rand(p.shape, generator=gen) * 2 * bound - bound)
        elif leaf == "index_kpool_compress_gate":
            p.fill_(1.0)
        elif leaf == "index_kpool_compress_ape":
            p.zero_()
        elif leaf.endswith("base") and p.dim() == 1:
            p.zero_()
        elif leaf.endswith("scale") and p.dim() == 1:
            p.fill_(1.0)
        elif p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif leaf == "weight":
            p.fill_(1.0)
        else:
            p.zero_()
    for name, b in module.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()


def check_params(module, what):
    bad = []
    for n, p in module.named_parameters():
        if not torch.isfinite(p).all() or p.abs().max() > 1e4:
            bad.append(n)
    if bad:
        log(f"WARNING {what}: non-finite or huge initial values in {bad[:8]} ({len(bad)}); re-initialising them")
        with torch.no_grad():
            for n, p in module.named_parameters():
                if n in bad:
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.02)
                    else:
                        p.zero_()
    return bad


# ----------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------


def train_tokenizer(convs, vocab, outdir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts():
        for c in convs:
            yield "".join(f"{m['role']}\n{m['content']}\n" for m in c["messages"])

    tok.train_from_iterator(texts(), trainer=trainer, length=len(convs))
    tok.add_special_tokens(SPECIALS)
    write_tokenizer_files(tok, outdir)
    return tok


def write_tokenizer_files(tok, outdir):
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True}
            for s in SPECIALS
        },
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


def tokenizer_cases(tok, outdir, fxdir):
    """Ids from HF tokenizers (and transformers' chat template) for ferrite's tokenizer test."""
    texts = [
        "What does ephemeral mean?",
        "Ephemeral (adjective): lasting a very short time.",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\n\nand   runs    of spaces",
        "Numbers 1234567 and 3.14159, dates 2024-06-01.",
        "Unicode: café, naïve, Zürich, Ελληνικά, русский, 日本語, 한국어, emoji 😀👍🏽",
        "Quotes \"double\" and 'single' and “curly” — dashes -- and ellipsis...",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "text<|im_end|>more<|endoftext|>",
        "I'm, you're, it's, we'll, they've, she'd, don't",
        "UPPER lower MiXeD CamelCase snake_case kebab-case",
        "a" * 50 + " " + "ab" * 30,
        "\n",
        "",
        "The Devil's Dictionary defines air as: \"A nutritious substance supplied by a bountiful Providence.\"",
    ]
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    chats = [
        ([{"role": "user", "content": "What does ephemeral mean?"}], True),
        ([{"role": "system", "content": "You are ferrite-tiny."}, {"role": "user", "content": "Hello!"},
          {"role": "assistant", "content": "Hi! Which word shall we look up today?"},
          {"role": "user", "content": "Give me a synonym for happy."}], True),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}], False),
    ]
    chat_cases = []
    hf_ok = None
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(outdir)
        hf_ok = True
    except Exception as e:
        log(f"AutoTokenizer.from_pretrained failed ({e!r}); chat cases use the Python renderer")
        hf = None
    for msgs, gen in chats:
        text = render(msgs, gen)
        if hf is not None:
            try:
                t2 = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
                if t2 != text:
                    log(f"WARNING transformers renders {t2!r}, Python renderer {text!r}")
                    hf_ok = False
            except Exception as e:
                log(f"apply_chat_template failed: {e!r}")
                hf_ok = False
        chat_cases.append({"messages": msgs, "add_generation_prompt": gen, "text": text,
                           "ids": tok.encode(text, add_special_tokens=False).ids})
    if hf is not None:
        for c in cases:
            ids2 = hf.encode(c["text"], add_special_tokens=False)
            if list(ids2) != c["ids"]:
                log(f"WARNING transformers and tokenizers disagree on {c['text']!r}")
                hf_ok = False
    import tokenizers as tk

    out = {
        "tokenizers_version": tk.__version__,
        "transformers_render_matches_python_renderer": hf_ok,
        "encode": cases,
        "chat": chat_cases,
        "decode": [{"ids": c["ids"], "text": tok.decode(c["ids"], skip_special_tokens=False)} for c in cases[:8]],
    }
    with open(os.path.join(fxdir, "tokenizer_cases.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    log(f"tokenizer cases written (transformers agrees: {hf_ok})")


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


def load_jsonl(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def tokenize_convs(tok, convs, seq):
    import numpy as np

    segs, owner, flags = [], [], []
    for i, c in enumerate(convs):
        for text, tgt in segments(c["messages"]):
            segs.append(text)
            owner.append(i)
            flags.append(tgt)
    encs = tok.encode_batch(segs, add_special_tokens=False)
    ids = [[] for _ in convs]
    mask = [[] for _ in convs]
    for e, i, tgt in zip(encs, owner, flags):
        ids[i].extend(e.ids)
        mask[i].extend([tgt] * len(e.ids))
    # check that segment-wise encoding equals encoding the whole rendering
    rng = random.Random(0)
    sample = rng.sample(range(len(convs)), min(500, len(convs)))
    full = tok.encode_batch([render(convs[i]["messages"]) for i in sample], add_special_tokens=False)
    bad = sum(1 for i, e in zip(sample, full) if e.ids != ids[i])
    log(f"segment-wise vs whole encoding: {bad} of {len(sample)} differ")
    if bad:
        log("WARNING re-encoding whole conversations and masking by offsets")
        full = tok.encode_batch([render(c["messages"]) for c in convs], add_special_tokens=False)
        for i, (c, e) in enumerate(zip(convs, full)):
            spans, pos = [], 0
            for text, tgt in segments(c["messages"]):
                if tgt:
                    spans.append((pos, pos + len(text)))
                pos += len(text)
            ids[i] = e.ids
            mask[i] = [any(a <= o[0] < b for a, b in spans) for o in e.offsets]
    lens = np.array([len(x) for x in ids])
    keep = [i for i in range(len(convs)) if 0 < lens[i] <= seq]
    log(f"tokens: {int(lens.sum())} in {len(convs)} conversations (mean {lens.mean():.1f}, max {lens.max()}); "
        f"{len(convs) - len(keep)} longer than {seq} dropped")
    return ids, mask, keep


def pack(ids, mask, keep, seq, pad, seed):
    """Greedy packing with a small look-ahead; rows start at conversation boundaries."""
    import numpy as np

    rng = random.Random(seed)
    order = list(keep)
    rng.shuffle(order)
    rows_x, rows_m = [], []
    pending = []
    it = iter(order)
    exhausted = False

    def refill():
        nonlocal exhausted
        while len(pending) < 64 and not exhausted:
            try:
                pending.append(next(it))
            except StopIteration:
                exhausted = True

    refill()
    while pending:
        row, rmask = [], []
        while True:
            refill()
            room = seq - len(row)
            j = next((k for k, ci in enumerate(pending) if len(ids[ci]) <= room), None)
            if j is None:
                break
            ci = pending.pop(j)
            row.extend(ids[ci])
            rmask.extend(mask[ci])
        n = len(row)
        rows_x.append(row + [pad] * (seq - n))
        rows_m.append(rmask + [False] * (seq - n))
    x = np.array(rows_x, dtype=np.int32)
    m = np.array(rows_m, dtype=bool)
    fill = float((x != pad).mean())
    log(f"packed {len(rows_x)} rows of {seq}: fill {fill:.3f}, target tokens {int(m.sum())} ({m.mean():.3f} of slots)")
    return x, m


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------


class Balancer:
    """Aux-loss-free load balancing (DeepSeek-V3): after each step, nudge every router's
    e_score_correction_bias up for under-loaded experts and down for over-loaded ones."""

    def __init__(self, modules, rate):
        self.rate = rate
        self.routers = [m for m in modules if type(m).__name__.endswith("TopkRouter")]
        self.counts = {}
        self.warned = False
        for r in self.routers:
            r.register_forward_hook(self.hook)

    def hook(self, mod, inp, out):
        if not mod.training:
            return
        try:
            logits = out[0] if isinstance(out, tuple) else out
            E = mod.e_score_correction_bias.numel()
            logits = logits.detach().reshape(-1, logits.shape[-1])
            if logits.shape[-1] != E:
                raise ValueError(f"router output {tuple(logits.shape)}, {E} experts")
            k = mod.top_k if hasattr(mod, "top_k") else 2
            top = (logits.float().sigmoid() + mod.e_score_correction_bias.float()).topk(k, dim=-1).indices
            c = torch.zeros(E, dtype=torch.long, device=top.device).scatter_add_(
                0, top.flatten(), torch.ones_like(top.flatten()))  # bincount would synchronise
            self.counts[id(mod)] = self.counts.get(id(mod), 0) + c
        except Exception as e:
            if not self.warned:
                log(f"WARNING balancer hook: {e!r}")
                self.warned = True

    def step(self, stats=False):
        """Applies the update; with stats, returns the worst max/mean expert load (synchronises)."""
        worst = []
        with torch.no_grad():
            for r in self.routers:
                c = self.counts.get(id(r))
                if c is None or isinstance(c, int):
                    continue
                c = c.float()
                mean = c.mean()
                r.e_score_correction_bias.add_(self.rate * torch.sign(mean - c).to(r.e_score_correction_bias.dtype))
                if stats:
                    worst.append(c.max() / mean.clamp_min(1))
        self.counts = {}
        return float(torch.stack(worst).max()) if worst else 0.0


def device():
    return torch.device(os.environ.get("FERRITE_TRAIN_DEVICE", "cuda"))


def train(args, model, blk, x_np, m_np, pad, ckdir, out_summary):
    import numpy as np

    dev = device()
    cuda = dev.type == "cuda"
    text = model.model.language_model
    lm_head = model.lm_head
    embed = text.embed_tokens
    V = lm_head.weight.shape[0]

    model.to(dev)
    blk.to(dev)
    for p in model.model.visual.parameters():
        p.requires_grad_(False)
    named = [(f"model.{n}", p) for n, p in text.named_parameters()] + [("lm_head.weight", lm_head.weight)]
    named += [(f"mtp.{n}", p) for n, p in blk.named_parameters()]
    seen, decay, no_decay = set(), [], []
    for n, p in named:
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        if p.dim() >= 2 and "embed_tokens" not in n and ".hc_" not in n and "attn_hc" not in n and "ffn_hc" not in n:
            decay.append(p)
        else:
            no_decay.append(p)
    nparams = sum(p.numel() for p in decay + no_decay)
    log(f"optimising {nparams / 1e6:.2f}M parameters ({len(decay)} decayed tensors, {len(no_decay)} not)")
    groups = [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception as e:
        log(f"fused AdamW unavailable ({e!r}); using foreach")
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    bal = Balancer(list(text.modules()) + list(blk.modules()), args.balance_rate)
    log(f"balancer: {len(bal.routers)} routers")

    X = torch.from_numpy(x_np).to(dev)
    Y = torch.from_numpy(np.where(m_np, x_np, -100).astype(np.int64)).to(dev)
    N = X.shape[0]

    state = {"step": 0, "elapsed": 0.0, "tokens": 0, "target_tokens": 0, "epoch": 0, "pos": 0,
             "history": [], "skipped": 0, "batch": None}
    ck = os.path.join(ckdir, "ckpt.pt")
    if args.resume and os.path.exists(args.resume):
        sd = torch.load(args.resume, map_location=dev, weights_only=False)
        model.load_state_dict(sd["model"], strict=False)
        blk.load_state_dict(sd["mtp"])
        opt.load_state_dict(sd["opt"])
        state.update(sd["state"])
        log(f"resumed from {args.resume}: step {state['step']}, {state['elapsed']:.0f}s trained")

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + state["epoch"])
    perm = torch.randperm(N, generator=gen, device=dev)

    def next_batch(B):
        nonlocal perm
        if state["pos"] + B > N:
            state["epoch"] += 1
            state["pos"] = 0
            gen.manual_seed(args.seed + state["epoch"])
            perm = torch.randperm(N, generator=gen, device=dev)
        idx = perm[state["pos"]: state["pos"] + B]
        state["pos"] += B
        return X[idx].long(), Y[idx]

    amp = {"on": True}

    def loss_fn(x, y):
        # no boolean indexing: it would synchronise with the GPU every step
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp["on"]):
            h = text(input_ids=x, use_cache=False).last_hidden_state
            logits = lm_head(h[:, :-1])
            l_main = F.cross_entropy(logits.float().reshape(-1, V), y[:, 1:].reshape(-1), ignore_index=-100)
            hm = blk(embed(x[:, 1:]), h[:, :-1])
            ml = lm_head(hm[:, :-1])
            l_mtp = F.cross_entropy(ml.float().reshape(-1, V), y[:, 2:].reshape(-1), ignore_index=-100)
        return l_main, l_mtp, (y[:, 1:] != -100).sum()

    model.train()
    blk.train()
    torch.backends.cuda.matmul.allow_tf32 = True

    # batch size: the largest candidate that fits
    cands = [b for b in args.batch_candidates if b <= N] or [min(N, 8)]
    if state["batch"]:
        cands = [state["batch"]]
    B = None
    for b in list(cands):
        try:
            x, y = next_batch(b)
            lm, lt, _ = loss_fn(x, y)
            (lm + args.mtp_weight * lt).backward()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            B = b
            log(f"batch {b} x {x.shape[1]} fits: peak {peak_gib():.1f} GiB, "
                f"first losses {lm.item():.3f} / {lt.item():.3f}")
            break
        except torch.OutOfMemoryError:
            log(f"batch {b}: out of memory")
            opt.zero_grad(set_to_none=True)
            del x, y
            torch.cuda.empty_cache()
        except Exception:
            if not amp["on"]:
                raise
            traceback.print_exc()
            log("WARNING the bf16 autocast step failed; retrying in float32 (TF32 matmuls)")
            amp["on"] = False
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()
            cands.insert(cands.index(b) + 1, b)
        state["pos"] = 0
    if B is None:
        raise RuntimeError("no batch size fits")
    state["batch"] = B
    if cuda and torch.cuda.max_memory_allocated() > 0.8 * torch.cuda.get_device_properties(0).total_memory:
        log("WARNING close to the memory limit")

    train_budget = args.train_until - now() + state["elapsed"]
    # one schedule across several runs (--resume): the cosine spans this many training seconds
    schedule = args.schedule_seconds or train_budget
    log(f"training budget {train_budget:.0f}s (until t={args.train_until}s, {state['elapsed']:.0f}s done before), "
        f"cosine over {schedule:.0f}s")
    t_start = time.time() - state["elapsed"]
    last_ck = time.time()
    ema = None
    tgt_acc = torch.tensor(state["target_tokens"], dtype=torch.long, device=dev)
    loss_acc = torch.zeros(2, device=dev)
    n_acc = 0
    while True:
        elapsed = time.time() - t_start
        if now() >= args.train_until or (args.max_steps and state["step"] >= args.max_steps):
            break
        frac = min(1.0, elapsed / max(schedule, 1.0))
        lr = args.lr * min(1.0, (state["step"] + 1) / args.warmup) * (
            args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next_batch(B)
        lm, lt, ntgt = loss_fn(x, y)
        loss = lm + args.mtp_weight * lt
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], args.clip)
        if not torch.isfinite(gn):  # the one synchronisation per step (a NaN loss shows here too)
            state["skipped"] += 1
            opt.zero_grad(set_to_none=True)
            bal.counts = {}
            log(f"step {state['step']}: non-finite gradient norm, skipped ({state['skipped']} so far)")
            if state["skipped"] > 50:
                raise RuntimeError("too many non-finite steps")
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        if state["step"] == 12:
            t12 = time.time()
        if state["step"] == 22 and B >= 128 and not state.get("batch_adapted"):
            per = (time.time() - t12) / 10
            left = train_budget - (time.time() - t_start)
            log(f"step time {per:.3f}s at batch {B}: about {left / per:.0f} more steps")
            state["batch_adapted"] = True
            if left / per < args.min_steps:
                B //= 2
                state["batch"] = B
                log(f"batch halved to {B} to get more optimizer steps")
        logging = state["step"] % args.log_every == 0 or state["step"] <= 3
        imb = bal.step(logging)
        state["tokens"] += B * x.shape[1]
        tgt_acc += ntgt
        loss_acc += torch.stack([lm.detach(), lt.detach()])
        n_acc += 1
        if logging:
            lmv, ltv = (loss_acc / n_acc).tolist()
            loss_acc.zero_()
            n_acc = 0
            state["target_tokens"] = int(tgt_acc)
            ema = (lmv, ltv) if ema is None else (0.7 * ema[0] + 0.3 * lmv, 0.7 * ema[1] + 0.3 * ltv)
            el = time.time() - t_start
            rec = {"step": state["step"], "t": round(el, 1), "lr": lr, "loss": round(lmv, 4), "mtp_loss": round(ltv, 4),
                   "ema_loss": round(ema[0], 4), "ema_mtp_loss": round(ema[1], 4), "grad_norm": round(float(gn), 3),
                   "target_tokens": state["target_tokens"],
                   "tokens": state["tokens"], "epoch": state["epoch"], "expert_imbalance": round(imb, 2)}
            state["history"].append(rec)
            log(f"step {state['step']:5d} loss {lmv:.4f} (ema {ema[0]:.4f}) mtp {ltv:.4f} (ema {ema[1]:.4f}) "
                f"gn {float(gn):.2f} lr {lr:.2e} tok {state['tokens'] / 1e6:.1f}M ep {state['epoch']} "
                f"imb {imb:.2f} {state['tokens'] / max(el, 1e-9) / 1e3:.0f}k tok/s")
        if time.time() - last_ck > args.ckpt_every:
            state["elapsed"] = time.time() - t_start
            save_ckpt(ck, model, blk, opt, state)
            last_ck = time.time()
    state["elapsed"] = time.time() - t_start
    state["target_tokens"] = int(tgt_acc)
    if n_acc:
        lmv, ltv = (loss_acc / n_acc).tolist()
        ema = (lmv, ltv) if ema is None else (0.7 * ema[0] + 0.3 * lmv, 0.7 * ema[1] + 0.3 * ltv)
    state["final_ema_loss"], state["final_ema_mtp_loss"] = ema if ema else (None, None)
    log(f"training done: {state['step']} steps, {state['tokens'] / 1e6:.1f}M tokens "
        f"({state['target_tokens'] / 1e6:.1f}M target), {state['elapsed']:.0f}s, epochs {state['epoch']}, "
        f"ema loss {state['final_ema_loss']}, mtp {state['final_ema_mtp_loss']}, "
        f"peak mem {peak_gib():.1f} GiB")
    try:
        save_ckpt(ck, model, blk, opt, state)
    except Exception as e:
        log(f"final checkpoint failed: {e!r}")
    out_summary["train"] = {k: v for k, v in state.items() if k != "history"}
    out_summary["train"]["history"] = state["history"]
    out_summary["train"]["params_optimised"] = nparams
    out_summary["train"]["bf16_autocast"] = amp["on"]
    model.eval()
    blk.eval()
    return state


def peak_gib():
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def swap_fn(model, old, new):
    """Replace references to function old by new in the modules' attributes (transformers'
    use_kernelized_func keeps the functions on the instances too)."""
    for m in model.modules():
        d = m.__dict__
        for key in list(d.keys()):
            v = d[key]
            if v is old:
                d[key] = new
            elif isinstance(v, dict):
                for k2 in list(v.keys()):
                    if v[k2] is old:
                        v[k2] = new


def save_ckpt(path, model, blk, opt, state):
    t = time.time()
    tmp = path + ".tmp"
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("model.visual.")}
    torch.save({"model": sd, "mtp": blk.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
    os.replace(tmp, path)
    log(f"checkpoint {path} ({os.path.getsize(path) / 1e6:.0f} MB, {time.time() - t:.1f}s)")


# ----------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------


def save_final(model, blk, tok, outdir):
    text = model.model.language_model
    L = len(text.layers)
    with torch.no_grad():
        blk.shared_head.head.weight.copy_(model.lm_head.weight)
    model.to("cpu", torch.float32)
    blk.to("cpu", torch.float32)
    mg.round_to_bf16(model)
    mg.round_to_bf16(blk)
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    gc = model.generation_config
    gc.eos_token_id = [im_end, eot]
    gc.pad_token_id = eot
    gc.bos_token_id = None
    text.layers.append(blk)
    try:
        model.to(torch.bfloat16)
        for c in (model.config, model.config.text_config, model.config.vision_config):
            c.dtype = torch.bfloat16
        model.save_pretrained(outdir)
    finally:
        del text.layers[L]
        model.to(torch.float32)
        blk.to(torch.float32)
        for c in (model.config, model.config.text_config, model.config.vision_config):
            c.dtype = torch.float32
    path = os.path.join(outdir, "config.json")
    cfg = json.load(open(path))
    cfg["dtype"] = "bfloat16"
    cfg["text_config"]["dtype"] = "bfloat16"
    if "vision_config" in cfg:
        cfg["vision_config"]["dtype"] = "bfloat16"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    files = sorted(os.listdir(outdir))
    log(f"saved {outdir}: {files}; model.safetensors {os.path.getsize(os.path.join(outdir, 'model.safetensors')) / 1e6:.1f} MB")


# ----------------------------------------------------------------------------
# Evaluation (GPU, float32)
# ----------------------------------------------------------------------------


STOP = set(
    """a an the of to in on at by for with from as and or but not no nor is are was were be been being am
    that this these those it its which who whom whose what when where why how than then so such very
    into out up down over under about after before between through during without within upon
    one ones some any all each every other another more most less least many much few own same
    has have had having do does did doing can could may might must shall should will would
    something someone somebody usually especially often used use using
    person people thing things way kind state quality act make made being""".split()
)


def cwords(s):
    return {w[:5] for w in re.findall(r"[a-z]+", s.lower()) if w not in STOP and len(w) > 2}


def first_definition(ans):
    m = re.search(r"\):\s*(.*?)(?:\.\s+It can also mean|\.\s+Example:|\.$|$)", ans)
    return m.group(1).strip() if m else ""


def score_define(item, ans):
    word = item["word"]
    d = first_definition(ans)
    head_ok = ans.lower().startswith(word.lower() + " (")
    gold = item["gold"]
    exact = d.rstrip(".").strip().lower() == gold[0].strip().lower() if gold else False
    got = cwords(d)
    lenient = False
    for g in gold:
        gw = cwords(g)
        if gw and len(gw & got) / len(gw) >= 0.5:
            lenient = True
            break
    return {"headword": head_ok, "exact_first_sense": exact, "overlap": lenient and head_ok}


def score_synonym(item, ans):
    m = re.search(r"(?:Synonyms of [^:]+:|synonym of \S+ is)\s*(.*?)\.?$", ans)
    got = set()
    if m:
        got = {w.strip().lower() for w in re.split(r",| and ", m.group(1)) if w.strip()}
    return {"any_synonym": bool(got & {g.lower() for g in item["gold"]})}


@no_grad
def greedy_batch(text, lm_head, prompts, im_end, pad, max_new, deadline):
    dev = lm_head.weight.device
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    Lmax = int(lens.max()) + max_new + 1
    buf = torch.full((B, Lmax), pad, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = torch.tensor(p, device=dev)
    start = lens.clone()
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    ar = torch.arange(B, device=dev)
    for _ in range(max_new):
        if now() > deadline:
            log("greedy: deadline reached")
            break
        L = int(lens.max())
        h = text(input_ids=buf[:, :L], use_cache=False).last_hidden_state
        nxt = lm_head(h[ar, lens - 1]).argmax(-1)
        live = ~done
        buf[ar[live], lens[live]] = nxt[live]
        lens = lens + live.long()
        done = done | (nxt == im_end)
        if bool(done.all()):
            break
    outs = []
    for i in range(B):
        outs.append(buf[i, start[i]: lens[i]].tolist())
    return buf, start, lens, outs


@no_grad
def mtp_acceptance(text, lm_head, blk, buf, start, lens):
    """Share of generated positions where the MTP's draft (from h_p and token p+1) equals the
    greedy token p+2: the acceptance of a 1-token greedy draft."""
    L = int(lens.max())
    x = buf[:, :L]
    h = text(input_ids=x, use_cache=False).last_hidden_state
    hm = blk(text.embed_tokens(x[:, 1:]), h[:, :-1])
    draft = lm_head(hm).argmax(-1).cpu().numpy()  # [B, L-1]: position p predicts token p+2
    xs = x.cpu().numpy()
    acc = tot = 0
    for i in range(xs.shape[0]):
        s, e = int(start[i]), int(lens[i])
        if e - 2 > s - 1:
            ok = draft[i, s - 1: e - 2] == xs[i, s + 1: e]
            acc += int(ok.sum())
            tot += int(ok.size)
    return acc, tot


def evaluate(model, blk, tok, evals, args, summary, outdir):
    dev = device()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    text = model.model.language_model
    model.to(dev)
    blk.to(dev)
    model.eval()
    blk.eval()
    im_end, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    items = list(evals)
    # seen words asked with a training phrasing too (memorisation)
    for it in evals:
        if it["kind"] == "seen_define_new_phrasing":
            items.append(dict(it, kind="seen_define_train_phrasing", question=f"What does {it['word']} mean?"))
    extra = [{"kind": "chat", "question": q, "word": None, "gold": None} for q in CHAT_QUESTIONS]
    items += extra
    prompts = [tok.encode(render([{"role": "user", "content": it["question"]}], True), add_special_tokens=False).ids
               for it in items]
    results = []
    acc_tot = [0, 0]
    bs = args.eval_batch
    for b0 in range(0, len(items), bs):
        if now() > args.eval_deadline:
            log("eval deadline reached")
            break
        buf, start, lens, outs = greedy_batch(text, model.lm_head, prompts[b0: b0 + bs], im_end, pad, args.max_new,
                                              args.eval_deadline)
        try:
            if acc_tot[1] < 20000 and now() < args.eval_deadline:
                a, t = mtp_acceptance(text, model.lm_head, blk, buf, start, lens)
                acc_tot[0] += a
                acc_tot[1] += t
        except Exception as e:
            log(f"MTP acceptance failed: {e!r}")
        for it, o in zip(items[b0: b0 + bs], outs):
            ids = [i for i in o if i != im_end]
            ans = tok.decode(ids, skip_special_tokens=True)
            r = {"kind": it["kind"], "word": it.get("word"), "question": it["question"], "answer": ans,
                 "ended": bool(o and o[-1] == im_end)}
            if it["kind"].endswith("define") or "define_" in it["kind"]:
                r.update(score_define(it, ans))
                r["reference"] = it.get("answer")
            elif "synonym" in it["kind"]:
                r.update(score_synonym(it, ans))
                r["gold"] = it["gold"]
            results.append(r)
        log(f"eval: {len(results)} of {len(items)} answered")
    agg = {}
    for r in results:
        a = agg.setdefault(r["kind"], {"n": 0})
        a["n"] += 1
        for k in ("headword", "exact_first_sense", "overlap", "any_synonym", "ended"):
            if k in r:
                a[k] = a.get(k, 0) + int(r[k])
    for k, a in agg.items():
        for m in list(a):
            if m != "n":
                a[m + "_rate"] = round(a[m] / a["n"], 4)
    summary["eval"] = agg
    if acc_tot[1]:
        summary["mtp_greedy_acceptance"] = {"accepted": acc_tot[0], "drafted": acc_tot[1],
                                            "rate": round(acc_tot[0] / acc_tot[1], 4)}
    with open(os.path.join(outdir, "eval_results.json"), "w") as f:
        json.dump(results, f, indent=1, ensure_ascii=False)
    log("eval: " + json.dumps(agg))
    if acc_tot[1]:
        log(f"MTP greedy draft acceptance {acc_tot[0]}/{acc_tot[1]} = {acc_tot[0] / acc_tot[1]:.3f}")
    for r in results:
        if r["kind"] == "chat":
            log(f"  Q: {r['question']}\n      A: {r['answer']}")
    return results


# ----------------------------------------------------------------------------
# Fixture (CPU, float32), in the format of testdata/models
# ----------------------------------------------------------------------------


class FxSpec:
    name = NAME
    model_type = "glm5_next"
    mtp = "nextn_plain"
    options = [
        "the trained ferrite-tiny model itself (builtin/model), weights stored as BF16; references computed in "
        "float32 from those weights on the CPU",
        "layer_types [KDA, KDA, DSA, KDA, KDA, DSA], mlp_layer_types [dense, dense, sparse x4], hc_mult 4",
        "prompt = a chat conversation rendered with the model's template (index_topk = 1024 = the context, so the k-pool "
        "indexer keeps every complete pool)",
        "MTP: plain residual NextN block at model.language_model.layers.6",
    ]
    notes = []


def fixture_prompt(tok, word):
    msgs = [
        {"role": "system", "content": f"You are {NAME}, a helpful dictionary and quotation companion."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! Which word shall we look up today?"},
        {"role": "user", "content": "What is the opposite of hot?"},
        {"role": "assistant", "content": "The opposite of hot is cold."},
        {"role": "user", "content": f"What does {word} mean?"},
    ]
    ids = tok.encode(render(msgs, True), add_special_tokens=False).ids
    while len(ids) <= 64 or len(ids) % 64 == 0:
        msgs.insert(1, {"role": "user", "content": "Good morning."})
        msgs.insert(2, {"role": "assistant", "content": "Hello! How can I help?"})
        ids = tok.encode(render(msgs, True), add_special_tokens=False).ids
    return msgs, ids


def make_fixture(model, blk, tok, fxdir, mdir, words, summary):
    from safetensors.torch import save_file

    torch.backends.cuda.matmul.allow_tf32 = False
    model.to("cpu", torch.float32)
    blk.to("cpu", torch.float32)
    model.eval()
    blk.eval()
    text = model.model.language_model
    embed = text.embed_tokens

    def mtp_forward(final_hidden, ids):
        hm = blk(embed(ids[:, 1:]), final_hidden[:, :-1])
        return blk.shared_head.head(hm)

    best = None
    tried = []
    for w in words[:3]:
        msgs, ids = fixture_prompt(tok, w)
        prompt = torch.tensor([ids])
        T = len(ids)
        mg.T = T
        # decode ids: the greedy continuation's first tokens
        gen = []
        cur = prompt
        with torch.no_grad():
            for _ in range(mg.D):
                nxt = int(model(input_ids=cur, use_cache=False).logits[0, -1].argmax())
                gen.append(nxt)
                cur = torch.cat([cur, torch.tensor([[nxt]])], dim=1)
        decode_ids = torch.tensor(gen)
        refs, checks = mg.compute_refs(FxSpec, model, prompt, decode_ids, mtp_forward, log)
        rel = checks["topk_min_rel_gap"]
        score = min((rel / mg.MIN_TOPK_REL_GAP) if rel is not None else math.inf,
                    checks["greedy_min_top2_gap"] / mg.MIN_GREEDY_GAP)
        tried.append({"word": w, "T": T, "topk_min_rel_gap": rel, "greedy_min_top2_gap": checks["greedy_min_top2_gap"]})
        log(f"fixture prompt '{w}': T={T}, topk min rel gap {rel}, greedy min gap {checks['greedy_min_top2_gap']:.4g}")
        if best is None or score > best[0]:
            best = (score, w, msgs, prompt, decode_ids, refs, checks)
        if score >= 1:
            break
    _, w, msgs, prompt, decode_ids, refs, checks = best
    T = prompt.shape[1]
    mg.T = T
    manual = refs.pop("_manual_greedy")
    greedy = manual
    checks["greedy_source"] = "manual cached argmax loop"
    try:
        from transformers import GenerationConfig

        gcfg = GenerationConfig(do_sample=False, max_new_tokens=mg.GREEDY_N, eos_token_id=None, pad_token_id=0,
                                bos_token_id=None, use_cache=True)
        with torch.no_grad():
            seq = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=gcfg)
        g2 = seq[0, T:].to(torch.int32)
        checks["greedy_generate_matches_manual_loop"] = bool(torch.equal(g2, manual))
        if g2.numel() == mg.GREEDY_N:
            greedy = g2
            checks["greedy_source"] = "generate"
    except Exception as e:
        checks["greedy_generate_matches_manual_loop"] = None
        log(f"generate() failed: {e!r}")
    try:
        re_model = type(model).from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager")
        re_model.eval()
        with torch.no_grad():
            rl = re_model(input_ids=prompt).logits[0].float()
        checks["reload_max_abs_diff"] = float((rl - refs["prompt_logits"]).abs().max())
        log(f"reload via from_pretrained: max |dlogits| = {checks['reload_max_abs_diff']:.3g}")
        del re_model
    except Exception as e:
        checks["reload_max_abs_diff"] = None
        log(f"reload check failed: {e!r}")
    refs["prompt_ids"] = prompt[0].to(torch.int32)
    refs["decode_ids"] = decode_ids.to(torch.int32)
    refs["greedy_ids"] = greedy.to(torch.int32)
    stats = {k: mg.logit_stats(refs[k]) for k in ("prompt_logits", "decode_logits", "mtp_logits") if k in refs}
    os.makedirs(fxdir, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in refs.items()}
    save_file(tensors, os.path.join(fxdir, "reference.safetensors"), metadata={"format": "pt"})
    import tokenizers as tk
    import transformers as tf

    tcfg = mg.text_config(model.config)
    meta = {
        "name": NAME,
        "model_type": "glm5_next",
        "architecture": type(model).__name__,
        "T": T,
        "D": mg.D,
        "V": tcfg.vocab_size,
        "H": tcfg.hidden_size,
        "num_hidden_layers": tcfg.num_hidden_layers,
        "greedy_new_tokens": mg.GREEDY_N,
        "prompt_messages": msgs,
        "prompt_text": render(msgs, True),
        "prompt_candidates": tried,
        "weights_dtype": "bfloat16",
        "reference_dtype": "float32",
        "compute": f"cpu ({platform.machine()}), float32, eager attention and experts",
        "versions": {"transformers": tf.__version__, "torch": torch.__version__, "tokenizers": tk.__version__,
                     "python": platform.python_version()},
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "config_is_text_nested": True,
        "tensors": {k: {"shape": list(v.shape), "dtype": "I32" if v.dtype == torch.int32 else "F32"}
                    for k, v in sorted(tensors.items())},
        "tensor_descriptions": mg.describe_tensors(refs, FxSpec, tcfg, checks["hidden_states_layout"]),
        "logit_stats": stats,
        "checks": checks,
        "options": FxSpec.options,
        "notes": [
            "decode_ids are the model's own greedy continuation of the prompt (not random ids).",
            "The weights are the run's bf16 model/model.safetensors; ferrite embeds them quantized to Q8_0 "
            "(builtin/model/model.gguf, tools/packtiny) and checks them against these references "
            "(builtin/testdata/reference) at a Q8_0 tolerance.",
        ],
        "mtp": {
            "layer_index": tcfg.num_hidden_layers,
            "formula": "x = eh_proj(concat[enorm(embed(tok[p+1])), hnorm(final_hidden[p])]); x = x + "
                       "attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)) at position p (causal "
                       "over the MTP sequence, own k-pool indexer); logits = shared_head.head(shared_head.norm(x)). "
                       "shared_head.head is a copy of lm_head.",
            "hidden_convention": "post-final-norm: the MTP at position p consumes final_hidden[p]",
            "trained": "jointly with the main model (loss weight in MODEL_CARD.md)",
        },
    }
    with open(os.path.join(fxdir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    summary["fixture"] = {"T": T, "word": w, "checks": checks, "logit_stats": stats}
    log(f"fixture written: T={T}, checks {json.dumps(checks)}")


@no_grad
def make_answers(model, tok, fxdir, questions, summary):
    """Greedy answers (float32, CPU, cached decode) for ferrite's built-in model test."""
    model.to("cpu", torch.float32)
    im_end = tok.token_to_id("<|im_end|>")
    out = []
    for q in questions:
        ids = tok.encode(render([{"role": "user", "content": q["question"]}], True), add_special_tokens=False).ids
        o = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache = o.past_key_values
        nxt = o.logits[0, -1]
        gen, gaps = [], []
        for _ in range(64):
            top2 = torch.topk(nxt.float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
            t = int(nxt.argmax())
            gen.append(t)
            if t == im_end:
                break
            o = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            nxt = o.logits[0, -1]
        ans = tok.decode([t for t in gen if t != im_end], skip_special_tokens=True)
        keywords = sorted(w for w in re.findall(r"[a-z]+", ans.lower())
                          if q.get("gold_words") and w in q["gold_words"])
        out.append({"question": q["question"], "kind": q["kind"], "word": q.get("word"), "prompt_ids": ids,
                    "answer_ids": gen, "answer": ans, "ended_with_im_end": bool(gen and gen[-1] == im_end),
                    "top2_gaps": [round(g, 5) for g in gaps], "keywords": keywords})
        log(f"answer: {q['question']!r} -> {ans!r}")
    with open(os.path.join(fxdir, "answers.json"), "w") as f:
        json.dump({"note": "greedy answers computed by transformers in float32 on the CPU with the bf16 weights; "
                           "keywords are gold-gloss words that appear in the answer",
                   "answers": out}, f, indent=1, ensure_ascii=False)
    summary["answers"] = [{"question": a["question"], "answer": a["answer"]} for a in out]


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------


def main():
    global torch, nn, F, mg
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(HERE, "data", "corpus"))
    ap.add_argument("--out", default="/tmp/ferrite-tiny")
    ap.add_argument("--tokenizer-dir", default="", help="reuse this tokenizer instead of training one")
    ap.add_argument("--resume", default="", help="checkpoint to resume from")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--heads", type=int, default=5)
    ap.add_argument("--inter", type=int, default=896)
    ap.add_argument("--moe-inter", type=int, default=160)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--kda-chunk", type=int, default=16, help="chunk size of the torch KDA fallback in training")
    ap.add_argument("--batch-candidates", type=lambda s: [int(x) for x in s.split(",")], default=[512, 384, 256, 192, 128, 96, 64],
                    help="batch sizes tried in order; the first that fits in GPU memory is used")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--balance-rate", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-until", type=float, default=380.0, help="stop training at this many seconds after start")
    ap.add_argument("--schedule-seconds", type=float, default=0.0,
                    help="training seconds the cosine decay spans, counted over all resumed runs "
                         "(default: what this run trains, plus what a resumed checkpoint already trained)")
    ap.add_argument("--eval-deadline", type=float, default=0.0, help="default: train-until + 75")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--min-steps", type=int, default=300, help="halve the batch once if fewer steps would fit")
    ap.add_argument("--ckpt-every", type=float, default=150.0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-batch", type=int, default=640)
    ap.add_argument("--max-new", type=int, default=56)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    if not args.eval_deadline:
        args.eval_deadline = args.train_until + 75

    import torch as _torch
    import torch.nn as _nn
    import torch.nn.functional as _F
    import transformers

    torch, nn, F = _torch, _nn, _F
    spec = importlib.util.spec_from_file_location("make_goldens", os.path.join(REPO, "tools", "goldens", "make_goldens.py"))
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    mg.torch, mg.nn, mg.transformers = torch, nn, transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    dev_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.version.cuda}, gpu {dev_name}")

    out = args.out
    mdir = os.path.join(out, "model")
    fxdir = os.path.join(out, "fixture")
    ckdir = args.ckpt_dir or os.path.join(out, "ckpt")
    for d in (mdir, fxdir, ckdir):
        os.makedirs(d, exist_ok=True)
    summary = {"args": vars(args), "name": NAME}

    def dump_summary():
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)

    # ---- data + tokenizer
    convs = load_jsonl(os.path.join(args.corpus, "train.jsonl.gz"))
    evals = load_jsonl(os.path.join(args.corpus, "eval.jsonl.gz"))
    log(f"corpus: {len(convs)} conversations, {len(evals)} eval items")
    if args.tokenizer_dir and os.path.exists(os.path.join(args.tokenizer_dir, "tokenizer.json")):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
        write_tokenizer_files(tok, mdir)
        log(f"tokenizer loaded from {args.tokenizer_dir}")
    else:
        tok = train_tokenizer(convs, args.vocab, mdir)
        log(f"tokenizer trained: {tok.get_vocab_size()} tokens")
    V = tok.get_vocab_size()
    summary["vocab_size"] = V
    try:
        tokenizer_cases(tok, mdir, fxdir)
    except Exception:
        traceback.print_exc()
    ids, mask, keep = tokenize_convs(tok, convs, args.seq)
    pad = tok.token_to_id("<|endoftext|>")
    x_np, m_np = pack(ids, mask, keep, args.seq, pad, args.seed)
    summary["data"] = {"rows": int(x_np.shape[0]), "seq": args.seq, "tokens": int((x_np != pad).sum()),
                       "target_tokens": int(m_np.sum()), "conversations": len(keep)}
    dump_summary()

    # ---- model
    model = build_model(V, args)
    g = torch.Generator().manual_seed(args.seed)
    init_weights(model.model.language_model, 0.02, g)
    init_weights(model.lm_head, 0.02, g)
    check_params(model, "model")
    blk = build_mtp(model)
    init_weights(blk, 0.02, g)
    check_params(blk, "mtp")
    tcfg = mg.text_config(model.config)
    n_text = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual."))
    n_mtp = sum(p.numel() for p in blk.parameters())
    summary["params"] = {"text_incl_lm_head": n_text, "mtp_incl_head_copy": n_mtp,
                         "vision_stub": sum(p.numel() for p in model.model.visual.parameters())}
    log(f"model: {n_text / 1e6:.2f}M text + {n_mtp / 1e6:.2f}M MTP parameters; layer_types {tcfg.layer_types}")
    # KDA chunk size for training (the torch fallback's intra-chunk tensors scale with the chunk)
    mod = sys.modules[type(model).__module__]
    calls = {"n": 0}
    orig_chunk = getattr(mod, "chunk_kimi_delta_attention", None)
    if orig_chunk is not None and args.kda_chunk != 64:
        def chunk_patched(*a, **k):
            calls["n"] += 1
            k["chunk_size"] = args.kda_chunk
            return orig_chunk(*a, **k)

        mod.chunk_kimi_delta_attention = chunk_patched
        swap_fn(model, orig_chunk, chunk_patched)
        try:
            # equivalence check on one KDA layer in float32
            kda = next(m for m in model.modules() if type(m).__name__.endswith("LinearAttention"))
            xx = torch.randn(2, 80, tcfg.hidden_size) * 0.5
            with torch.no_grad():
                y16 = kda(xx)
                mod.chunk_kimi_delta_attention = orig_chunk
                y64 = kda(xx)
                mod.chunk_kimi_delta_attention = chunk_patched
            log(f"KDA chunk {args.kda_chunk} vs 64: max diff {float((y16 - y64).abs().max()):.3g} "
                f"(scale {float(y64.abs().max()):.3g}), patched calls {calls['n']}")
            if calls["n"] == 0:
                log("WARNING the chunk-size patch is not used; training with chunk 64")
        except Exception as e:
            log(f"KDA chunk check failed: {e!r}")
    summary["kda_chunk_patch_calls_in_check"] = calls["n"]

    # ---- train
    try:
        train(args, model, blk, x_np, m_np, pad, ckdir, summary)
    except Exception:
        traceback.print_exc()
        summary["train_error"] = traceback.format_exc()
        log("TRAINING FAILED; saving what there is")
        model.eval()
        blk.eval()
    dump_summary()

    # ---- save (rounds the weights to bf16 in place)
    save_final(model, blk, tok, mdir)
    dump_summary()

    # the references and the evaluation use transformers' own KDA chunk size
    if orig_chunk is not None and args.kda_chunk != 64:
        mod.chunk_kimi_delta_attention = orig_chunk
        swap_fn(model, chunk_patched, orig_chunk)
        swap_fn(blk, chunk_patched, orig_chunk)

    # ---- reference fixture on the CPU (float32) with the rounded weights
    try:
        make_fixture(model, blk, tok, fxdir, mdir, ["ephemeral", "candid", "happy"], summary)
    except Exception:
        traceback.print_exc()
        summary["fixture_error"] = traceback.format_exc()
    dump_summary()

    # ---- eval on the GPU (float32) until the eval deadline
    results = []
    try:
        if torch.cuda.is_available() or os.environ.get("FERRITE_TRAIN_DEVICE"):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            results = evaluate(model, blk, tok, evals, args, summary, out)
    except Exception:
        traceback.print_exc()
        summary["eval_error"] = traceback.format_exc()
    dump_summary()

    # ---- greedy answers for ferrite's test (CPU, float32)
    try:
        gold_by_word = {e["word"]: e for e in evals if e.get("word") and "define" in e["kind"]}
        qs = []
        for r in results:
            if r["kind"] == "seen_define_train_phrasing" and r.get("overlap") and len(qs) < 3:
                g = gold_by_word.get(r["word"], {})
                gw = set()
                for gl in g.get("gold", [])[:1]:
                    gw |= {w for w in re.findall(r"[a-z]+", gl.lower()) if w not in STOP and len(w) > 2}
                qs.append({"question": f"What does {r['word']} mean?", "kind": "define", "word": r["word"],
                           "gold_words": sorted(gw)})
        if not qs:
            qs.append({"question": "What does happy mean?", "kind": "define", "word": "happy",
                       "gold_words": ["enjoying", "feeling", "showing", "pleasure", "contentment"]})
        qs.append({"question": "Who are you?", "kind": "identity", "gold_words": ["ferrite", "tiny", "dictionary"]})
        qs.append({"question": "What is the opposite of hot?", "kind": "antonym", "gold_words": ["cold"]})
        make_answers(model, tok, fxdir, qs, summary)
    except Exception:
        traceback.print_exc()
        summary["answers_error"] = traceback.format_exc()
    summary["wall_s"] = round(now(), 1)
    dump_summary()
    log("done")


if __name__ == "__main__":
    main()
