#!/usr/bin/env python3
"""Retrain ferrite-tiny's MTP layer alone, the main model frozen: self-distillation with chained drafts.

The shipped MTP layer (model.language_model.layers.6) was trained jointly with the main model on the
corpus' next-next token (MODEL_CARD.md, loss weight 0.3, 862 steps). Speculation only needs it to agree
with the *main model's* greedy choice, and its drafts 2, 3, … are made from its own output state, which it
never saw in training. This script keeps every main-model weight bit for bit and trains only the MTP layer:

  * targets are the main model's own next-token distributions (soft targets plus the argmax), not the
    corpus: the draft for position p+2 should be what the main model will say there;
  * chained depths 1..D in one pass. Depth 1, row j (position j): x = eh_proj([enorm(E(t_{j+1})) |
    hnorm(h_j)]) with h_j the main model's post-final-norm state, predicting the main model's token at
    j+2. Depth d ≥ 2, row j (position j+d-1): the same block fed the depth d-1 output state of row j and
    the token the main model chose at position j+d-1, predicting its token at j+d+1. Its attention sees
    what ferrite's MTP cache holds when it drafts: the depth-1 rows at positions ≤ j, then the deeper
    rows of its own chain (one each). The block's MLA is NoPE and its k-pool indexer keeps every pool
    within the context (index_topk = max_position_embeddings), so the attention is dense; the custom
    masked form is checked against transformers' module on the causal case before training;
  * data: the corpus rows (the main model's hidden states computed once, stored in bf16), where a
    draft counts only when the token it stands for is an assistant turn's (the main model was trained
    on those alone, and a chat drafts there) and, at depth d ≥ 2, only when the chain's tokens are
    the ones the main model would itself have produced; plus
    sequences the main model generates greedily from corpus questions with no stop token (the text
    `ferrite bench --chat` times past an answer's end), where every position counts.

Outputs under --out: model/ (config + model.safetensors: the input checkpoint with only the MTP tensors
replaced, rounded to bf16), mtp.safetensors (those MTP tensors alone), mtp_logits.safetensors (the builtin reference's mtp_logits recomputed in
float32 on the CPU from its prompt and final_hidden), summary.json (acceptance before and after, per
depth, on chat answers and on past-the-answer text), log.txt.

  PYTHONUNBUFFERED=1 python3 tools/train/train_mtp.py --checkpoint /path/to/bf16 --out /tmp/mtp \
      --train-seconds 300
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import copy  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

os.environ.setdefault("USE_HUB_KERNELS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
MTP_PREFIX = "model.language_model.layers.6."
LOG = []


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def mtp_names(blk, ck):
    """Maps between the checkpoint's MTP tensors (per-expert matrices, as save_pretrained wrote them)
    and the block's state dict (transformers' fused expert tensors where the module has them)."""
    sd = blk.state_dict()
    direct = [k for k in sd if k in ck and tuple(ck[k].shape) == tuple(sd[k].shape)]
    fused = {}
    for k in sd:
        if k in direct:
            continue
        base, leaf = k.rsplit(".", 1)
        E = len({n.split(".")[len(base.split("."))] for n in ck if n.startswith(base + ".") and n[len(base) + 1:].split(".")[0].isdigit()})
        if leaf == "gate_up_proj" and E:
            g = torch.stack([ck[f"{base}.{e}.gate_proj.weight"] for e in range(E)])  # (E, I, H)
            u = torch.stack([ck[f"{base}.{e}.up_proj.weight"] for e in range(E)])
            w = torch.cat([g, u], dim=1)  # (E, 2I, H)
            fused[k] = ("gate_up", base, E, tuple(sd[k].shape) != tuple(w.shape))
        elif leaf == "down_proj" and E:
            w = torch.stack([ck[f"{base}.{e}.down_proj.weight"] for e in range(E)])  # (E, H, I)
            fused[k] = ("down", base, E, tuple(sd[k].shape) != tuple(w.shape))
        else:
            raise RuntimeError(f"MTP tensor {k} {tuple(sd[k].shape)}: no checkpoint tensor")
        want = tuple(sd[k].shape)
        got = tuple(w.transpose(1, 2).shape) if fused[k][3] else tuple(w.shape)
        if got != want:
            raise RuntimeError(f"MTP tensor {k}: {want} against the checkpoint's {got}")
    used = set(direct)
    for k, (kind, base, E, _) in fused.items():
        for e in range(E):
            for m in (("gate_proj", "up_proj") if kind == "gate_up" else ("down_proj",)):
                used.add(f"{base}.{e}.{m}.weight")
    left = [k for k in ck if k not in used]
    if left:
        raise RuntimeError(f"checkpoint MTP tensors not mapped: {left[:8]}")
    log(f"MTP names: {len(direct)} direct, fused expert tensors {sorted(fused)} (transposed: "
        f"{[k for k, f in fused.items() if f[3]]})")

    def to_module(c):
        out = {k: c[k] for k in direct}
        for k, (kind, base, E, tr_) in fused.items():
            if kind == "gate_up":
                w = torch.cat([torch.stack([c[f"{base}.{e}.gate_proj.weight"] for e in range(E)]),
                               torch.stack([c[f"{base}.{e}.up_proj.weight"] for e in range(E)])], dim=1)
            else:
                w = torch.stack([c[f"{base}.{e}.down_proj.weight"] for e in range(E)])
            out[k] = (w.transpose(1, 2) if tr_ else w).contiguous()
        return out

    def from_module(m):
        out = {k: m[k] for k in direct}
        for k, (kind, base, E, tr_) in fused.items():
            w = m[k].transpose(1, 2) if tr_ else m[k]
            for e in range(E):
                if kind == "gate_up":
                    I = w.shape[1] // 2
                    out[f"{base}.{e}.gate_proj.weight"] = w[e, :I].contiguous()
                    out[f"{base}.{e}.up_proj.weight"] = w[e, I:].contiguous()
                else:
                    out[f"{base}.{e}.down_proj.weight"] = w[e].contiguous()
        return out

    return to_module, from_module


class Chain:
    """The MTP block run at depths 1..D over all rows of a batch at once (see the module doc)."""

    def __init__(self, blk, embed, head, tcfg):
        self.blk, self.embed, self.head = blk, embed, head
        self.nh = tcfg.num_attention_heads
        self.dn = tcfg.qk_nope_head_dim
        self.dv = tcfg.v_head_dim
        self.scale = (tcfg.qk_nope_head_dim + tcfg.qk_rope_head_dim) ** -0.5

    def qkv(self, x):
        a = self.blk.self_attn
        B, S, _ = x.shape
        q = a.q_b_proj(a.q_a_layernorm(a.q_a_proj(x))).view(B, S, self.nh, self.dn).transpose(1, 2)
        c = a.kv_a_layernorm(a.kv_a_proj_with_mqa(x))
        kv = a.kv_b_proj(c).view(B, S, self.nh, self.dn + self.dv)
        return q, kv[..., : self.dn].transpose(1, 2), kv[..., self.dn:].transpose(1, 2)

    def attend(self, q, ks, vs):
        """q (B,nh,R,dn) of depth d = len(ks); ks[0]/vs[0] the depth-1 rows (all R), ks[e] the depth e+1
        row of the same chain. Row j sees depth-1 rows i ≤ j and its own chain's deeper rows."""
        q, k1, v1 = q.float(), ks[0].float(), vs[0].float()
        R = q.shape[2]
        s = torch.matmul(q, k1.transpose(-1, -2)) * self.scale
        causal = torch.ones(R, R, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        diag = [(q * k.float()).sum(-1, keepdim=True) * self.scale for k in ks[1:]]
        p = torch.softmax(torch.cat([s] + diag, dim=-1), dim=-1)
        o = torch.matmul(p[..., :R], v1)
        for e, v in enumerate(vs[1:]):
            o = o + p[..., R + e: R + e + 1] * v.float()
        return o

    def layer(self, x, ks, vs):
        """One depth: x (B,R,H) the block's input; appends this depth's k, v; returns the normed output."""
        blk = self.blk
        B, R, _ = x.shape
        q, k, v = self.qkv(blk.input_layernorm(x))
        ks.append(k)
        vs.append(v)
        o = self.attend(q, ks, vs).to(x.dtype)
        x = x + blk.self_attn.o_proj(o.transpose(1, 2).reshape(B, R, self.nh * self.dv))
        x = x + blk.mlp(blk.post_attention_layernorm(x))
        return blk.shared_head.norm(x)

    def inp(self, tok, hidden):
        blk = self.blk
        return blk.eh_proj(torch.cat([blk.enorm(self.embed(tok)), blk.hnorm(hidden)], dim=-1))

    def run(self, h, feed, chained, D):
        """h (B,S,H) main-model states; feed (B,S) the sequence's tokens, which depth 1 is fed;
        chained (B,S) the tokens deeper depths are fed (position i holds the token at i: what the main
        model chose there). Returns D logits tensors (B,R,V), R = S-D: depth d row j predicts the
        token at j+d+1."""
        S = h.shape[1]
        R = S - D
        ks, vs, outs = [], [], []
        state = h[:, :R]
        for d in range(1, D + 1):
            x = self.inp((feed if d == 1 else chained)[:, d: d + R], state)
            state = self.layer(x, ks, vs)
            outs.append(self.head(state))
        return outs


def main():
    global torch, nn, F
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="folder with config.json and the bf16 model.safetensors")
    ap.add_argument("--corpus", default=os.path.join(HERE, "data", "corpus"))
    ap.add_argument("--reference", default=os.path.join(REPO, "builtin", "testdata", "reference"))
    ap.add_argument("--out", default="/tmp/mtp")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--depth-weights", default="1.0,0.6,0.4")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--hard-weight", type=float, default=0.5, help="weight of CE on the main model's argmax beside the soft targets")
    ap.add_argument("--balance-rate", type=float, default=1e-3)
    ap.add_argument("--train-seconds", type=float, default=300.0)
    ap.add_argument("--gen-seconds", type=float, default=60.0, help="budget for generating past-the-answer text")
    ap.add_argument("--gen-rows", type=int, default=4096)
    ap.add_argument("--gen-weight", type=float, default=0.25, help="share of a batch drawn from generated rows")
    ap.add_argument("--eval-prompts", type=int, default=192)
    ap.add_argument("--seed", type=int, default=4321)
    args = ap.parse_args()

    import numpy as np
    import torch as _torch
    import torch.nn as _nn
    import torch.nn.functional as _F
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_file

    torch, nn, F = _torch, _nn, _F
    tr = load_module("ferrite_train", os.path.join(HERE, "train.py"))
    mg = load_module("make_goldens", os.path.join(REPO, "tools", "goldens", "make_goldens.py"))
    mg.torch, mg.nn, mg.transformers = torch, nn, transformers
    tr.torch, tr.nn, tr.F, tr.mg = torch, nn, F, mg
    tr.log = log
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    dev = torch.device("cuda")
    os.makedirs(os.path.join(args.out, "model"), exist_ok=True)
    summary = {"args": vars(args)}

    def dump():
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        with open(os.path.join(args.out, "log.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, gpu {torch.cuda.get_device_name(0)}")

    # ---- model: the checkpoint's main model and MTP block
    ck = os.path.join(args.checkpoint, "model.safetensors")
    with safe_open(ck, "pt") as f:
        meta = f.metadata()
        orig = {k: f.get_tensor(k) for k in f.keys()}
    from transformers import Glm5NextForConditionalGeneration

    # the main model through transformers' own loading (the checkpoint's names are converted on load)
    model = Glm5NextForConditionalGeneration.from_pretrained(
        args.checkpoint, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    log(f"main model loaded with from_pretrained ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters)")
    blk = tr.build_mtp(model)
    mtp_ck = {k[len(MTP_PREFIX):]: v.float() for k, v in orig.items() if k.startswith(MTP_PREFIX)}
    to_module, from_module = mtp_names(blk, mtp_ck)
    blk.load_state_dict(to_module(mtp_ck), strict=True)
    tcfg = mg.text_config(model.config)
    text = model.model.language_model
    model.to(dev).eval()
    blk.to(dev).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    embed, lm_head = text.embed_tokens, model.lm_head
    head_equal = bool(torch.equal(blk.shared_head.head.weight, lm_head.weight))
    log(f"MTP block loaded ({len(mtp_ck)} checkpoint tensors); shared_head.head == lm_head: {head_equal}")
    chain = Chain(blk, embed, blk.shared_head.head, tcfg)

    # ---- checks against the reference (float32, no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    with safe_open(os.path.join(args.reference, "reference.safetensors"), "pt") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
    pid = ref["prompt_ids"].long().reshape(1, -1).to(dev)
    with torch.no_grad():
        hr = text(input_ids=pid, use_cache=False).last_hidden_state
        d_logits = float((lm_head(hr)[0].cpu() - ref["prompt_logits"].float().reshape(hr.shape[1], -1)).abs().max())
        ml = blk.shared_head.head(blk(embed(pid[:, 1:]), hr[:, :-1]))[0].cpu()
        d_mtp = float((ml - ref["mtp_logits"].float().reshape(ml.shape)).abs().max())
        # the chain's masked attention, depth 1, against transformers' module on the same rows
        hm = blk(embed(pid[:, 1:]), hr[:, :-1])
        feed = pid.clone()
        cm = chain.run(hr, feed, feed, 1)[0]
        mine = cm[0]
        theirs = blk.shared_head.head(hm)[0, : mine.shape[0]]
        d_chain = float((mine - theirs).abs().max())
    summary["checks"] = {"prompt_logits_max_abs": d_logits, "mtp_logits_max_abs": d_mtp, "chain_vs_module_max_abs": d_chain}
    log(f"checks: main logits vs reference {d_logits:.3g}, MTP logits vs reference {d_mtp:.3g}, chain depth 1 vs module {d_chain:.3g}")
    dump()
    if d_logits > 1e-2 or d_mtp > 1e-2:
        raise RuntimeError("the checkpoint does not reproduce the reference")
    if d_chain > 1e-3:
        raise RuntimeError("the chain's attention does not match transformers' module")

    # ---- corpus rows and the main model's states
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(REPO, "builtin", "model", "tokenizer.json"))
    convs = tr.load_jsonl(os.path.join(args.corpus, "train.jsonl.gz"))
    ids, mask, keep = tr.tokenize_convs(tok, convs, args.seq)
    pad = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    x_np, m_np = tr.pack(ids, mask, keep, args.seq, pad, 1234)
    X = torch.from_numpy(x_np).to(dev).long()
    # an assistant turn's tokens (content and <|im_end|>): where a chat drafts
    M = torch.from_numpy(m_np).to(dev)
    N, S = X.shape

    @torch.no_grad()
    def states(x, bs=256):
        hs, ts = [], []
        for i in range(0, x.shape[0], bs):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = text(input_ids=x[i: i + bs], use_cache=False).last_hidden_state
            h = h.to(torch.bfloat16)
            hs.append(h)
            ts.append(lm_head(h.float()).argmax(-1).to(torch.int32))
        return torch.cat(hs), torch.cat(ts)

    t = time.time()
    H, T = states(X)
    real = X != pad
    log(f"corpus: {N} rows x {S}; main-model states in {time.time() - t:.0f}s ({H.numel() * 2 / 2**30:.1f} GiB); "
        f"main model's argmax = next corpus token at {float((T[:, :-1] == X[:, 1:])[real[:, 1:]].float().mean()):.3f} of positions")

    # ---- past-the-answer text: the main model's greedy continuations with no stop token
    @torch.no_grad()
    def greedy(prompts, total, deadline):
        """The main model's greedy continuations of prompts to `total` tokens each, with no stop token,
        all rows at once without a cache (a causal model: a row's padding after its end changes nothing
        before it); bf16 autocast, as the states are computed. Returns the (B, total) tokens and each
        row's length (total unless the deadline came first)."""
        B = len(prompts)
        buf = torch.full((B, total), pad, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            buf[i, : len(p)] = torch.tensor(p, device=dev)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ar = torch.arange(B, device=dev)
        while True:
            live = lens < total
            if not bool(live.any()) or time.time() > deadline:
                break
            L = int(lens[live].max())
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = text(input_ids=buf[:, :L], use_cache=False).last_hidden_state
            nxt = lm_head(h[ar, (lens - 1).clamp(max=L - 1)].float()).argmax(-1)
            buf[ar[live], lens[live]] = nxt[live]
            lens = lens + live.long()
        return buf, lens

    def questions(n, rng):
        out = []
        for c in rng.sample(convs, n):
            u = next((m for m in c["messages"] if m["role"] == "user"), None)
            if u:
                out.append(tok.encode(tr.render([{"role": "user", "content": u["content"]}], True), add_special_tokens=False).ids)
        return [p for p in out if len(p) < args.seq // 3]

    rng = random.Random(args.seed)
    # evaluation questions: the chat questions of train.py's evaluation and held-out dictionary ones
    evals = tr.load_jsonl(os.path.join(args.corpus, "eval.jsonl.gz"))
    # (the 2026-12-04 run asked 13 chat questions: train.py's list without the capital of France, the Devil's
    # Dictionary and blorptic, with "Use meticulous in a sentence.")
    qs = list(tr.CHAT_QUESTIONS)
    qs += [e["question"] for e in rng.sample(evals, min(len(evals), args.eval_prompts)) if e.get("question")]
    eval_prompts = [tok.encode(tr.render([{"role": "user", "content": q}], True), add_special_tokens=False).ids for q in qs]
    summary["eval_questions"] = len(eval_prompts)
    GX = None
    try:
        t = time.time()
        gp = questions(args.gen_rows, rng)
        GX, glen = greedy(gp, args.seq, time.time() + args.gen_seconds)
        GH, GT = states(GX)
        GV = torch.arange(args.seq, device=dev)[None] < glen[:, None]
        log(f"generated {GX.shape[0]} rows to {args.seq} tokens ({int(GV.sum())} valid positions) in {time.time() - t:.0f}s")
    except Exception:
        traceback.print_exc()
        log("WARNING generation failed; training on the corpus alone")
        GX = None
    summary["generated_rows"] = 0 if GX is None else int(GX.shape[0])

    # ---- acceptance: on chat answers (stop at <|im_end|>) and on text past the answer's end
    t = time.time()
    ans, ans_len = greedy(eval_prompts, args.seq // 2, time.time() + 120)
    alens = [len(p) for p in eval_prompts]
    ans_h, _ = states(ans)
    log(f"evaluation text: {len(eval_prompts)} questions answered to {int(ans_len.min())}-{int(ans_len.max())} tokens in {time.time() - t:.0f}s")

    @torch.no_grad()
    def acceptance(tag):
        res = {}
        h = ans_h
        D = args.depth
        feed = ans.clone()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = chain.run(h.float(), feed, feed, D)
        R = ans.shape[1] - D - 1
        # row j of depth d drafts the token at j+d+1; it is accepted if every depth ≤ d matched
        ok = torch.ones(ans.shape[0], R, dtype=torch.bool, device=dev)
        plen = torch.tensor(alens, device=dev)
        # answers: positions from the prompt's end to the first <|im_end|>; past: everything after it
        pos = torch.arange(R, device=dev)
        is_end = ans == im_end
        first_end = torch.where(is_end & (torch.arange(ans.shape[1], device=dev) >= plen[:, None]),
                                torch.arange(ans.shape[1], device=dev), ans.shape[1]).min(-1).values
        inside = pos[None] + D + 1 < ans_len[:, None]
        in_answer = (pos[None] >= plen[:, None] - 1) & (pos[None] + D + 1 <= first_end[:, None]) & inside
        past = (pos[None] > first_end[:, None]) & inside
        for d in range(1, D + 1):
            ok = ok & (outs[d - 1][:, :R].argmax(-1) == ans[:, d + 1: d + 1 + R])
            for name, m in (("answer", in_answer), ("past", past)):
                n = int(m.sum())
                res[f"{name}_depth{d}"] = float(ok[m].float().mean()) if n else None
                res[f"{name}_positions"] = n
        for name in ("answer", "past"):
            a = [res.get(f"{name}_depth{d}") or 0.0 for d in range(1, D + 1)]
            res[f"{name}_tokens_per_cycle"] = {k: 1 + sum(a[:k]) for k in range(1, D + 1)}
        log(f"acceptance {tag}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items()
                                               if not isinstance(v, dict)))
        log(f"acceptance {tag}: tokens per cycle, answer {res['answer_tokens_per_cycle']}, past {res['past_tokens_per_cycle']}")
        return res

    summary["acceptance_before"] = acceptance("before")
    dump()

    # ---- training
    D = args.depth
    wts = [float(w) for w in args.depth_weights.split(",")][:D]
    params = [p for n, p in blk.named_parameters() if not n.startswith("shared_head.head")]
    for n, p in blk.named_parameters():
        p.requires_grad_(not n.startswith("shared_head.head"))
    decay = [p for n, p in blk.named_parameters() if p.requires_grad and p.dim() >= 2]
    nodecay = [p for n, p in blk.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    bal = tr.Balancer(list(blk.modules()), args.balance_rate)
    log(f"training {sum(p.numel() for p in params) / 1e6:.2f}M MTP parameters, depth {D}, weights {wts}, "
        f"{len(bal.routers)} routers balanced")
    blk.train()

    def loss_fn(h, x, t_, target_ok, gen):
        """h states, x tokens, t_ the main model's argmax at each position (predicting the next),
        target_ok (B,S) the positions whose next token is a draft worth training for."""
        R = x.shape[1] - D
        with torch.autocast("cuda", dtype=torch.bfloat16):
            # depth 1 is fed the sequence's tokens; deeper depths the main model's own choices (a
            # generated row is made of them already)
            chained = x
            if not gen:
                chained = torch.cat([x[:, :1], t_[:, :-1].long()], dim=1)
            outs = chain.run(h.float(), x, chained, D)
        total, parts = 0.0, []
        chain_ok = torch.ones(x.shape[0], R, dtype=torch.bool, device=dev)
        for d in range(1, D + 1):
            # target: the main model's distribution at position j+d (predicting j+d+1)
            tl = lm_head(h[:, d: d + R].float()).float()
            tgt_p = torch.softmax(tl, -1)
            lp = torch.log_softmax(outs[d - 1].float(), -1)
            valid = target_ok[:, d: d + R]  # the target is the main model's at j+d, for the token at j+d+1
            if d >= 2 and not gen:
                # the chain was fed t_ for positions j+2..j+d: count it only where the corpus agrees
                chain_ok = chain_ok & (t_[:, d - 1: d - 1 + R].long() == x[:, d: d + R])
                valid = valid & chain_ok
            soft = -(tgt_p * lp).sum(-1)
            hard = F.nll_loss(lp.reshape(-1, lp.shape[-1]), tl.argmax(-1).reshape(-1), reduction="none").reshape(soft.shape)
            per = soft + args.hard_weight * hard
            vm = valid.float()
            l = (per * vm).sum() / vm.sum().clamp_min(1)
            total = total + wts[d - 1] * l
            parts.append(l.detach())
        return total, torch.stack(parts)

    t_start = time.time()
    step = 0
    hist = []
    acc = torch.zeros(D, device=dev)
    nacc = 0
    g = torch.Generator(device=dev).manual_seed(args.seed)
    nb_gen = int(round(args.batch * args.gen_weight)) if GX is not None else 0
    try:
        while time.time() - t_start < args.train_seconds:
            frac = (time.time() - t_start) / args.train_seconds
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
            for gr in opt.param_groups:
                gr["lr"] = lr
            loss = 0.0
            parts = torch.zeros(D, device=dev)
            nc = args.batch - nb_gen
            idx = torch.randint(0, N, (nc,), generator=g, device=dev)
            l1, p1 = loss_fn(H[idx], X[idx], T[idx], torch.cat([M[idx, 1:], M[idx, :1] & False], dim=1), False)
            loss = l1 * nc / args.batch
            parts = p1 * nc / args.batch
            if nb_gen:
                gi = torch.randint(0, GX.shape[0], (nb_gen,), generator=g, device=dev)
                l2, p2 = loss_fn(GH[gi], GX[gi], GT[gi], torch.cat([GV[gi, 1:], GV[gi, :1] & False], dim=1), True)
                loss = loss + l2 * nb_gen / args.batch
                parts = parts + p2 * nb_gen / args.batch
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            stats = step % 50 == 0
            imb = bal.step(stats)
            acc += parts
            nacc += 1
            if stats:
                v = (acc / nacc).tolist()
                acc.zero_()
                nacc = 0
                rec = {"step": step, "t": round(time.time() - t_start, 1), "lr": lr, "loss": [round(a, 4) for a in v],
                       "grad_norm": round(float(gn), 3), "imbalance": round(imb, 2)}
                hist.append(rec)
                log(f"step {step:5d} t {rec['t']:6.1f}s loss by depth {rec['loss']} gn {rec['grad_norm']} lr {lr:.2e} imb {imb:.2f}")
    except Exception:
        traceback.print_exc()
        summary["train_error"] = traceback.format_exc()
        log("TRAINING FAILED")
    log(f"training done: {step} steps in {time.time() - t_start:.0f}s")
    summary["train"] = {"steps": step, "seconds": round(time.time() - t_start, 1), "history": hist}
    blk.eval()
    mg.round_to_bf16(blk)
    summary["acceptance_after"] = acceptance("after (bf16 weights)")
    dump()

    # ---- outputs: the checkpoint with the MTP tensors replaced; the reference's mtp_logits
    new = dict(orig)
    sd = from_module({k: v.detach().to("cpu") for k, v in blk.state_dict().items()})
    changed = 0
    for k, v in sd.items():
        name = MTP_PREFIX + k
        if name not in orig:
            raise RuntimeError(f"{name}: not in the checkpoint")
        nv = v.to(orig[name].dtype).contiguous()
        if not torch.equal(nv, orig[name]):
            changed += 1
        new[name] = nv
    save_file(new, os.path.join(args.out, "model", "model.safetensors"), metadata=meta)
    # the MTP tensors alone (a tenth of the file): merge_mtp.py puts them into the checkpoint elsewhere
    save_file({k: v for k, v in new.items() if k.startswith(MTP_PREFIX)}, os.path.join(args.out, "mtp.safetensors"), metadata=meta)
    for fn in ("config.json", "generation_config.json"):
        src = os.path.join(args.checkpoint, fn)
        if os.path.exists(src):
            with open(src) as a, open(os.path.join(args.out, "model", fn), "w") as b:
                b.write(a.read())
    log(f"saved {args.out}/model/model.safetensors: {changed} MTP tensors changed, main model unchanged")
    blk.to("cpu", torch.float32)
    model.to("cpu", torch.float32)
    with torch.no_grad():
        fh = ref["final_hidden"].float().reshape(1, -1, tcfg.hidden_size)
        pid_c = ref["prompt_ids"].long().reshape(1, -1)
        ml = blk.shared_head.head(blk(embed(pid_c[:, 1:]), fh[:, :-1]))[0].contiguous()
    save_file({"mtp_logits": ml.reshape(ref["mtp_logits"].shape).contiguous()}, os.path.join(args.out, "mtp_logits.safetensors"))
    summary["mtp_logits_stats"] = mg.logit_stats(ml)
    log(f"reference mtp_logits recomputed on the CPU (float32): {summary['mtp_logits_stats']}")
    summary["wall_s"] = round(time.time() - T0, 1)
    dump()
    log("done")


if __name__ == "__main__":
    main()
