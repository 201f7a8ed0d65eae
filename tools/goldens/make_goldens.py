#!/usr/bin/env python3
"""Build tiny random-weight reference fixtures from Hugging Face transformers.

For every architecture ferrite serves, this script builds a tiny model from a
hand-written config that exercises the layer types and options of the real
model, re-initialises all weights at scales large enough that a wrong formula
gives a large error, runs it in true float32 and writes a fixture folder:

    <out>/<name>/config.json             as transformers writes it (save_pretrained)
    <out>/<name>/generation_config.json  as transformers writes it
    <out>/<name>/model.safetensors       weights (F32, or BF16 for *-bf16), MTP weights included
    <out>/<name>/reference.safetensors   reference tensors (F32 / I32)
    <out>/<name>/reference.json          human-readable metadata

MTP (next-token-prediction) heads are ignored by transformers, so the script
builds them itself from transformers' own decoder-layer / attention / MoE
classes, stores their weights under the names real checkpoints use, and
records `mtp_logits`.

Runs where transformers 5.17 + PyTorch 2.11 are installed (the GPU machine);
it downloads nothing.  Typical use (from the repository root):

    PYTHONUNBUFFERED=1 python3 tools/goldens/make_goldens.py --out testdata/models
    PYTHONUNBUFFERED=1 python3 tools/goldens/make_goldens.py --only qwen3_next,glm5_next

Every architecture is built inside its own try/except: a failure is reported
and the others are still written.  The exit status is 1 if any failed.
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import sys
import time
import traceback

# Never reach for the hub: no network on the device, and hub kernels would
# replace the reference torch paths.
os.environ.setdefault("USE_HUB_KERNELS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

T = 83  # prompt length: > 64, not a multiple of 64 (crosses the chunk boundary of chunked linear attention)
D = 4  # decode steps fed one at a time after the prompt
V = 512  # vocabulary size of every fixture
GREEDY_N = 16  # generate(do_sample=False, max_new_tokens=16)
PROMPT_SEED = 20240601
DECODE_SEED = 20240602
# Near-ties in any top-k (router / indexer) or in a greedy argmax make a
# reference fragile: an engine with a different summation order could pick a
# different expert or token.  If the smallest relative gap at a top-k boundary
# is below MIN_TOPK_REL_GAP (or a greedy top1-top2 logit gap below
# MIN_GREEDY_GAP), the weights are redrawn with the next seed.
MIN_TOPK_REL_GAP = 2e-5
MIN_GREEDY_GAP = 1e-3
MAX_ATTEMPTS = 8

torch = None  # imported in main()
nn = None
transformers = None


# ----------------------------------------------------------------------------
# Fixture specifications
# ----------------------------------------------------------------------------


class Spec:
    def __init__(self, name, model_type, seed, make, mtp=None, store_dtype="float32", options=(), notes=()):
        self.name = name
        self.model_type = model_type
        self.seed = seed
        self.make = make  # () -> (model_class, config)
        self.mtp = mtp  # None | "qwen3_next" | "nextn" | "nextn_plain"
        self.store_dtype = store_dtype
        self.options = list(options)
        self.notes = list(notes)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM, cfg


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen3ForCausalLM, cfg


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        num_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen3MoeForCausalLM, cfg


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=None,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return MixtralForCausalLM, cfg


def _glm4_moe():
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    cfg = Glm4MoeConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
        attention_bias=True,
        use_qk_norm=True,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        num_nextn_predict_layers=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Glm4MoeForCausalLM, cfg


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        attention_bias=False,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Qwen3NextForCausalLM, cfg


def _glm4_moe_lite():
    from transformers import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM

    cfg = Glm4MoeLiteConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=1.8,
        kv_lora_rank=32,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rope_interleave=True,
        mlp_layer_types=["dense", "sparse", "sparse"],
        num_nextn_predict_layers=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return Glm4MoeLiteForCausalLM, cfg


def _deepseek_v32():
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    cfg = DeepseekV32Config(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=16,
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        first_k_dense_replace=1,
        index_topk=16,
        index_head_dim=32,
        index_n_heads=8,
        num_nextn_predict_layers=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return DeepseekV32ForCausalLM, cfg


def _glm_moe_dsa():
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    cfg = GlmMoeDsaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        first_k_dense_replace=1,
        index_topk=16,
        index_head_dim=32,
        index_n_heads=8,
        # GLM-5.x style IndexCache schedule: full iff max(i - offset + 1, 0) % freq == 0
        # -> ["full", "full", "shared", "full"] for 4 layers.
        index_topk_freq=2,
        index_skip_topk_offset=2,
        num_nextn_predict_layers=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return GlmMoeDsaForCausalLM, cfg


def _glm5_next():
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    text = dict(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=24,
        qk_rope_head_dim=0,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        layer_types=["linear_attention", "deepseek_sparse_attention", "linear_attention", "deepseek_sparse_attention"],
        mlp_layer_types=["dense", "dense", "sparse", "sparse"],
        index_topk=16,
        index_head_dim=16,
        index_n_heads=8,
        index_kpool=4,
        index_kpool_always_select_tail=True,
        swiglu_limit=1.5,
        linear_head_dim=16,
        linear_num_heads=4,
        linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0,
        hc_mult=4,
        hc_eps=1e-6,
        hc_sinkhorn_iters=20,
        num_nextn_predict_layers=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        num_heads=2,
        intermediate_size=32,
        out_hidden_size=64,
        projection_intermediate_size=64,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )
    cfg = Glm5NextConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return Glm5NextForConditionalGeneration, cfg


SPECS = [
    Spec(
        "llama",
        "llama",
        1001,
        _llama,
        options=[
            "GQA (4 query heads, 2 kv heads), head_dim 16",
            "tied embeddings (tie_word_embeddings: true, no lm_head tensor)",
            "llama3 RoPE scaling (factor 8, low/high_freq_factor 1/4, original_max_position_embeddings 64): "
            "with head_dim 16 and theta 5e5 the 8 frequencies hit all three branches (kept, smoothed, divided by factor)",
        ],
    ),
    Spec(
        "qwen3",
        "qwen3",
        1002,
        _qwen3,
        options=[
            "explicit head_dim 32 != hidden/heads (16)",
            "QK norm (per-head RMSNorm over head_dim before RoPE)",
            "GQA 4/2",
            "untied embeddings",
        ],
    ),
    Spec(
        "qwen3-bf16",
        "qwen3",
        1102,
        _qwen3,
        store_dtype="bfloat16",
        options=["same architecture as qwen3 (different weights)", "weights stored as BF16"],
        notes=[
            "All parameters were rounded to bfloat16 (round-to-nearest-even, torch .to(bfloat16)) BEFORE the "
            "reference was computed; the reference tensors were then computed in float32 from those rounded "
            "weights. model.safetensors stores the BF16 values, so an engine that converts BF16->F32 exactly "
            "(bf16 bits << 16) and computes in F32 should match the references as tightly as the F32 fixtures.",
        ],
    ),
    Spec(
        "qwen3_moe",
        "qwen3_moe",
        1003,
        _qwen3_moe,
        options=[
            "sparse MoE: 8 experts, top-3, softmax then top-k, norm_topk_prob true, no shared expert",
            "decoder_sparse_step 2: MoE at layers 1 and 3, dense MLP (intermediate_size 160) at layers 0 and 2",
            "QK norm, explicit head_dim 32, GQA 4/2",
        ],
    ),
    Spec(
        "mixtral",
        "mixtral",
        1004,
        _mixtral,
        options=[
            "block_sparse_moe: 8 experts, top-2, softmax then top-k then renormalise",
            "experts use intermediate_size (96)",
            "GQA 4/2, head_dim = hidden/heads = 16",
            "sliding_window null",
        ],
    ),
    Spec(
        "glm4_moe",
        "glm4_moe",
        1005,
        _glm4_moe,
        mtp="nextn",
        options=[
            "attention_bias true (q/k/v bias, o_proj without bias)",
            "use_qk_norm true",
            "partial RoPE: partial_rotary_factor 0.5 of head_dim 32 (NeoX half-split inside the first 16 dims)",
            "explicit head_dim 32 != hidden/heads",
            "GQA 4/2",
            "first_k_dense_replace 1 (layer 0 dense, layers 1-3 MoE)",
            "sigmoid noaux_tc router with random e_score_correction_bias, n_group 1, routed_scaling_factor 2.5, "
            "norm_topk_prob, 1 shared expert",
            "MTP (NextN) layer at model.layers.4",
        ],
    ),
    Spec(
        "qwen3_next",
        "qwen3_next",
        1006,
        _qwen3_next,
        mtp="qwen3_next",
        options=[
            "layer_types [linear, full, linear, full]: Gated DeltaNet + gated full attention",
            "GDN: 2 key heads, 4 value heads (GQA inside GDN, repeat_interleave), head dims 16, conv kernel 4",
            "T=83 crosses the 64-token chunk boundary of the chunked delta rule",
            "gated attention: q_proj gives query and gate per head; QK norm (1+w); partial RoPE 0.25 of head_dim 32",
            "zero-centred (1+w) RMSNorms everywhere except the GDN gated norm",
            "mlp_only_layers [0] (dense MLP, intermediate_size 128), MoE elsewhere: 8 experts top-2 softmax, "
            "norm_topk_prob, shared expert (48) with sigmoid shared_expert_gate",
            "MTP head under mtp.* (mtp_num_hidden_layers 1)",
        ],
    ),
    Spec(
        "glm4_moe_lite",
        "glm4_moe_lite",
        1007,
        _glm4_moe_lite,
        mtp="nextn",
        options=[
            "MLA without DSA: q_lora_rank 24, kv_lora_rank 32, qk_nope 16, qk_rope 8, v_head 16",
            "rope_interleave true (interleaved pairs on the rope slice, which is the LAST part of q/k)",
            "mlp_layer_types [dense, sparse, sparse]",
            "sigmoid noaux_tc router + e_score_correction_bias, routed_scaling_factor 1.8, 1 shared expert",
            "MTP (NextN) layer at model.layers.3",
        ],
    ),
    Spec(
        "deepseek_v32",
        "deepseek_v32",
        1008,
        _deepseek_v32,
        mtp="nextn",
        options=[
            "MLA + DSA lightning indexer (index_n_heads 8, index_head_dim 32, index_topk 16 < T: tokens really dropped)",
            "indexer RoPE: NeoX half-split on the FIRST 8 dims of each 32-dim index head; MLA RoPE interleaved on the "
            "last 8 dims",
            "YaRN RoPE (factor 4, original_max_position_embeddings 64, beta 32/1, mscale 1/1): the 4 frequencies hit "
            "extrapolated, blended and interpolated branches; softmax scale multiplied by mscale^2",
            "grouped routing: 16 experts in n_group 4, topk_group 2, top-4, sigmoid + e_score_correction_bias, "
            "routed_scaling_factor 2.5, 1 shared expert",
            "first_k_dense_replace 1",
            "MTP (NextN) layer at model.layers.3 with its own indexer",
        ],
    ),
    Spec(
        "glm_moe_dsa",
        "glm_moe_dsa",
        1009,
        _glm_moe_dsa,
        mtp="nextn",
        options=[
            "MLA + DSA indexer with INTERLEAVED indexer RoPE (GLM-5), index_topk 16 < T",
            "IndexCache: index_topk_freq 2, index_skip_topk_offset 2 -> indexer_types [full, full, shared, full]; "
            "the shared layer 2 has no indexer weights and reuses layer 1's top-k",
            "first_k_dense_replace 1, sigmoid router + e_score_correction_bias, 1 shared expert",
            "MTP (NextN) layer at model.layers.4 with its own (full) indexer",
        ],
    ),
    Spec(
        "glm5_next",
        "glm5_next",
        1010,
        _glm5_next,
        mtp="nextn_plain",
        options=[
            "Glm5NextForConditionalGeneration (vision-language) with a tiny 1-block vision tower; references are "
            "text-only (no pixel inputs): ferrite serves the text part",
            "layer_types [linear(KDA), deepseek_sparse_attention, linear(KDA), deepseek_sparse_attention]",
            "mlp_layer_types [dense, dense, sparse, sparse]",
            "KDA: 4 heads x 16, conv kernel 4, linear_lower_bound -5 (sigmoid gate branch), per-channel decay, "
            "sigmoid output gate, T=83 crosses the 64-token chunk boundary",
            "NoPE MLA (qk_rope_head_dim 0) + k-pool DSA indexer: index_kpool 4, index_topk 16 (4 pools of 20), "
            "index_kpool_always_select_tail true",
            "mHC: hc_mult 4, hc_sinkhorn_iters 20, hc_eps 1e-6; final collapse = unweighted mean over streams",
            "clamped SwiGLU with swiglu_limit 1.5 (lowered from 10 so the clamp is really hit at these scales)",
            "MTP: plain residual NextN block (no hyper-connections) with MLA + k-pool DSA indexer + MoE",
        ],
    ),
]


# ----------------------------------------------------------------------------
# Weight initialisation
# ----------------------------------------------------------------------------

ZERO_CENTRED_NORMS = {"Qwen3NextRMSNorm"}


def _normal(gen, shape, std, mean=0.0):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def _uniform(gen, shape, lo, hi):
    return torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo


def reinit(module, gen, hidden_size, tied=False, prefix="", log=None):
    """Re-initialise every parameter (and the router correction-bias buffers) of module.

    Scales: linear weights N(0, gain/sqrt(fan_in)), embeddings N(0,1) (N(0, 2/sqrt(H)) when tied to the
    lm_head), norm weights 1+U(-0.3,0.3) (U(-0.3,0.3) for zero-centred 1+w norms), biases N(0,0.5),
    routers N(0, 2/sqrt(H)), correction biases U(-0.2,0.2), decay parameters in a realistic range.
    """
    done = set()
    unknown = []
    for mname, mod in module.named_modules(prefix=prefix):
        cls = type(mod).__name__
        entries = list(mod.named_parameters(recurse=False))
        entries += [(n, b) for n, b in mod.named_buffers(recurse=False) if n == "e_score_correction_bias"]
        for pname, p in entries:
            if id(p) in done:
                continue
            done.add(id(p))
            full = f"{mname}.{pname}" if mname else pname
            shape = tuple(p.shape)
            new = None
            if cls in ZERO_CENTRED_NORMS:
                new = _uniform(gen, shape, -0.3, 0.3)
            elif isinstance(mod, nn.LayerNorm) or cls.endswith("LayerNorm"):
                new = _uniform(gen, shape, 0.7, 1.3) if pname == "weight" else _normal(gen, shape, 0.2)
            elif "RMSNorm" in cls:
                new = _uniform(gen, shape, 0.7, 1.3)
            elif isinstance(mod, nn.Embedding):
                new = _normal(gen, shape, (2.0 / math.sqrt(shape[1])) if tied else 1.0)
            elif isinstance(mod, nn.Conv1d):
                new = _normal(gen, shape, 0.5) if pname == "weight" else _normal(gen, shape, 0.2)
            elif isinstance(mod, nn.Linear):
                if pname == "weight":
                    gain = 1.0
                    leaf = mname.rsplit(".", 1)[-1]
                    if leaf in ("lm_head", "head"):
                        gain = 2.0
                    elif leaf in ("q_proj", "k_proj", "q_b_proj", "kv_b_proj", "wq_b", "wk"):
                        gain = 1.3
                    new = _normal(gen, shape, gain / math.sqrt(shape[1]))
                else:
                    new = _normal(gen, shape, 0.5)
            elif "Router" in cls and pname == "weight":
                new = _normal(gen, shape, 2.0 / math.sqrt(shape[1]))
            elif pname == "e_score_correction_bias":
                new = _uniform(gen, shape, -0.2, 0.2)
            elif pname == "gate_up_proj" and len(shape) == 3:
                new = _normal(gen, shape, 1.0 / math.sqrt(shape[2]))
            elif pname == "down_proj" and len(shape) == 3:
                new = _normal(gen, shape, 1.0 / math.sqrt(shape[2]))
            elif cls == "Qwen3NextGatedDeltaNet" and pname == "A_log":
                # g = -exp(A_log) * softplus(a + dt_bias): per-step decays from ~0.99 down to ~0.05
                new = torch.log(_uniform(gen, shape, 0.05, 1.5))
            elif cls == "Qwen3NextGatedDeltaNet" and pname == "dt_bias":
                new = _normal(gen, shape, 0.5)
            elif cls.endswith("ForgetGate") and pname == "A_log":
                new = _normal(gen, shape, 0.5)
            elif cls.endswith("ForgetGate") and pname == "dt_bias":
                # g = -5 * sigmoid(exp(A_log) * (f + dt_bias)): mostly slow decays, some fast
                new = _normal(gen, shape, 2.0, mean=-3.0)
            elif cls.endswith("HyperConnection"):
                if pname == "fn":
                    new = _normal(gen, shape, 1.0 / math.sqrt(shape[1]))
                elif pname == "base":
                    new = _normal(gen, shape, 0.5)
                elif pname == "scale":
                    new = _uniform(gen, shape, 0.5, 1.5)
            elif pname == "index_kpool_compress_ape":
                new = _normal(gen, shape, 1.0)
            elif pname == "index_kpool_compress_gate":
                new = _normal(gen, shape, 1.0 / math.sqrt(shape[1]))
            if new is None:
                # generic fallback (vision tower convolutions etc.)
                if len(shape) >= 2:
                    fan_in = int(math.prod(shape[1:]))
                    new = _normal(gen, shape, 1.0 / math.sqrt(fan_in))
                else:
                    new = _normal(gen, shape, 0.3)
                if ".visual." not in "." + full:
                    unknown.append(f"{full} ({cls}, {list(shape)})")
            with torch.no_grad():
                p.data.copy_(new.to(p.dtype))
    if unknown and log is not None:
        log(f"    generic init used for: {unknown}")


def round_to_bf16(module):
    with torch.no_grad():
        for p in module.parameters():
            if p.dtype == torch.float32:
                p.data.copy_(p.data.to(torch.bfloat16).to(torch.float32))
        for n, b in module.named_buffers():
            if n.endswith("e_score_correction_bias") and b.dtype == torch.float32:
                b.copy_(b.to(torch.bfloat16).to(torch.float32))


# ----------------------------------------------------------------------------
# Top-k near-tie monitor
# ----------------------------------------------------------------------------


class TopkMonitor:
    """Patches torch.topk / Tensor.topk and records the smallest relative gap at the k-th boundary."""

    def __init__(self):
        self.min_rel = math.inf
        self.min_abs = math.inf
        self.calls = 0
        self.boundaries = 0

    def _record(self, x, args, kwargs):
        try:
            k = args[0] if len(args) > 0 else kwargs["k"]
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
            largest = args[2] if len(args) > 2 else kwargs.get("largest", True)
            if not largest or not torch.is_floating_point(x):
                return
            x = x.detach().float()
            if x.dim() == 0:
                return
            n = x.shape[dim]
            self.calls += 1
            if k >= n or k <= 0:
                return
            vals = self._orig(x, k + 1, dim=dim).values
            a = vals.narrow(dim, k - 1, 1)
            b = vals.narrow(dim, k, 1)
            ok = torch.isfinite(b) & (b > -1e30)
            if not bool(ok.any()):
                return
            finite = torch.isfinite(x) & (x > -1e30)
            rowmax = x.masked_fill(~finite, 0.0).abs().amax(dim=dim, keepdim=True)
            scale = torch.maximum(torch.maximum(a.abs(), b.abs()), 1e-3 * rowmax).clamp_min(1e-30)
            gap = a - b
            rel = gap / scale
            self.boundaries += int(ok.sum())
            self.min_rel = min(self.min_rel, float(rel[ok].min()))
            self.min_abs = min(self.min_abs, float(gap[ok].min()))
        except Exception as e:  # never break the model because of the monitor
            print(f"    [topk monitor] skipped a call: {e!r}")

    def __enter__(self):
        self._orig = torch.topk
        self._orig_m = torch.Tensor.topk
        mon = self
        orig, orig_m = self._orig, self._orig_m

        def topk(input, *args, **kwargs):
            mon._record(input, args, kwargs)
            return orig(input, *args, **kwargs)

        def topk_m(self_, *args, **kwargs):
            mon._record(self_, args, kwargs)
            return orig_m(self_, *args, **kwargs)

        torch.topk = topk
        torch.Tensor.topk = topk_m
        return self

    def __exit__(self, *exc):
        torch.topk = self._orig
        torch.Tensor.topk = self._orig_m
        return False


# ----------------------------------------------------------------------------
# MTP modules (written here: transformers ignores them)
# ----------------------------------------------------------------------------


def clone_config(cfg, **changes):
    d = cfg.to_dict()
    d.update(changes)
    for k in ("transformers_version", "architectures", "dtype", "torch_dtype"):
        d.pop(k, None)
    new = type(cfg).from_dict(d)
    new._attn_implementation = "eager"
    new._experts_implementation = "eager"
    return new


def text_config(cfg):
    return cfg.text_config if hasattr(cfg, "text_config") and cfg.text_config is not None else cfg


def causal_mask(S, dtype=None):
    dtype = dtype or torch.float32
    m = torch.full((S, S), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return m[None, None]


def build_mtp(spec, model, gen):
    """Returns (module, attach_fn, forward_fn, description)."""
    cfg = text_config(model.config)
    L = cfg.num_hidden_layers
    H = cfg.hidden_size
    mod = sys.modules[type(model).__module__]

    if spec.mtp == "qwen3_next":
        cfg2 = clone_config(
            cfg,
            num_hidden_layers=L + 1,
            layer_types=list(cfg.layer_types) + ["full_attention"],
            mlp_only_layers=[],
            decoder_sparse_step=1,
        )

        class Qwen3NextMTP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2 * H, H, bias=False)
                self.pre_fc_norm_embedding = mod.Qwen3NextRMSNorm(H, eps=cfg.rms_norm_eps)
                self.pre_fc_norm_hidden = mod.Qwen3NextRMSNorm(H, eps=cfg.rms_norm_eps)
                self.layers = nn.ModuleList([mod.Qwen3NextDecoderLayer(cfg2, L)])
                self.norm = mod.Qwen3NextRMSNorm(H, eps=cfg.rms_norm_eps)

        mtp = Qwen3NextMTP()
        reinit(mtp, gen, H, prefix="mtp")

        def forward(final_hidden, ids):
            emb = model.get_input_embeddings()(ids[:, 1:])
            h = final_hidden[:, :-1]
            x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(emb), mtp.pre_fc_norm_hidden(h)], dim=-1))
            S = x.shape[1]
            pos = torch.arange(S)[None]
            pe = model.model.rotary_emb(x, pos)
            out = mtp.layers[0](x, position_embeddings=pe, attention_mask=causal_mask(S), position_ids=pos)
            if isinstance(out, tuple):
                out = out[0]
            return model.lm_head(mtp.norm(out))

        def attach():
            model.mtp = mtp

        def detach():
            del model.mtp

        desc = {
            "tensor_prefix": "mtp.",
            "formula": "e = pre_fc_norm_embedding(embed(tok[p+1])); h = pre_fc_norm_hidden(final_hidden[p]); "
            "x = fc(concat[e, h]) (EMBEDDING FIRST); x = mtp.layers.0(x) at position p (full-attention "
            "decoder layer: gated attention + sparse MoE with shared expert, causal over the MTP sequence); "
            "logits = lm_head(mtp.norm(x)). All four norms are zero-centred (1+w). embed_tokens and lm_head "
            "are the main model's.",
        }
        return mtp, attach, detach, forward, desc

    # DeepSeek / GLM NextN: layer index L = num_hidden_layers
    ext = dict(num_hidden_layers=L + 1)
    if getattr(cfg, "layer_types", None) is not None:
        lt = list(cfg.layer_types)
        ext["layer_types"] = lt + [
            "deepseek_sparse_attention" if "deepseek_sparse_attention" in lt else "full_attention"
        ]
    if getattr(cfg, "mlp_layer_types", None) is not None:
        ext["mlp_layer_types"] = list(cfg.mlp_layer_types) + ["sparse"]
    if getattr(cfg, "indexer_types", None) is not None:
        ext["indexer_types"] = list(cfg.indexer_types) + ["full"]
    cfg2 = clone_config(cfg, **ext)

    rms_cls = None
    for name in dir(mod):
        if name.endswith("RMSNorm") and "Gated" not in name and "Unweighted" not in name and "Vision" not in name:
            if rms_cls is None or name.endswith("TextRMSNorm"):
                rms_cls = getattr(mod, name)

    if spec.mtp == "nextn_plain":
        attn_cls = getattr(mod, "Glm5NextTextAttention")
        moe_cls = getattr(mod, "Glm5NextTextMoE")

        class PlainNextNBlock(nn.Module):
            """NextN block with a plain residual stream (no hyper-connections)."""

            def __init__(self):
                super().__init__()
                self.self_attn = attn_cls(cfg2, L)
                self.mlp = moe_cls(cfg2)
                self.input_layernorm = rms_cls(H, eps=cfg.rms_norm_eps)
                self.post_attention_layernorm = rms_cls(H, eps=cfg.rms_norm_eps)

            def forward(self, x):
                S = x.shape[1]
                r = x
                h = self.input_layernorm(x)
                h = self.self_attn(
                    hidden_states=h,
                    attention_mask=torch.ones(x.shape[0], S, dtype=torch.bool),
                    past_key_values=None,
                )[0]
                x = r + h
                r = x
                return r + self.mlp(self.post_attention_layernorm(x))

        blk = PlainNextNBlock()
    else:
        layer_cls = None
        for name in dir(mod):
            if name.endswith("DecoderLayer") and "Vision" not in name:
                layer_cls = getattr(mod, name)
        blk = layer_cls(cfg2, L)

    blk.enorm = rms_cls(H, eps=cfg.rms_norm_eps)
    blk.hnorm = rms_cls(H, eps=cfg.rms_norm_eps)
    blk.eh_proj = nn.Linear(2 * H, H, bias=False)
    blk.shared_head = nn.Module()
    blk.shared_head.norm = rms_cls(H, eps=cfg.rms_norm_eps)
    blk.shared_head.head = nn.Linear(H, cfg.vocab_size, bias=False)
    reinit(blk, gen, H, prefix=f"layers.{L}")
    with torch.no_grad():
        blk.shared_head.head.weight.copy_(model.get_output_embeddings().weight)

    text_model = model.model.language_model if hasattr(model.model, "language_model") else model.model

    def forward(final_hidden, ids):
        emb = model.get_input_embeddings()(ids[:, 1:])
        h = final_hidden[:, :-1]
        x = blk.eh_proj(torch.cat([blk.enorm(emb), blk.hnorm(h)], dim=-1))
        S = x.shape[1]
        if spec.mtp == "nextn_plain":
            out = blk(x)
        else:
            pos = torch.arange(S)[None]
            pe = text_model.rotary_emb(x, pos)
            out = blk(
                x,
                attention_mask=causal_mask(S),
                position_ids=pos,
                past_key_values=None,
                use_cache=False,
                position_embeddings=pe,
            )
        if isinstance(out, tuple):
            out = out[0]
        return blk.shared_head.head(blk.shared_head.norm(out))

    def attach():
        text_model.layers.append(blk)

    def detach():
        del text_model.layers[L]

    desc = {
        "layer_index": L,
        "formula": "x = eh_proj(concat[enorm(embed(tok[p+1])), hnorm(final_hidden[p])]) (EMBEDDING FIRST); "
        "x = x + attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)) at position p, causal over "
        "the MTP sequence (its own KV / indexer cache); logits = shared_head.head(shared_head.norm(x)). "
        "shared_head.head is a copy of lm_head (real checkpoints store an identical copy). No vLLM-style "
        "zeroing of the embedding at position 0.",
    }
    if spec.mtp == "nextn_plain":
        desc["formula"] += (
            " glm5_next: the block is a plain residual block (no attn_hc/ffn_hc), NoPE MLA with its own k-pool "
            "DSA indexer, MoE with clamped SwiGLU."
        )
    return blk, attach, detach, forward, desc


# ----------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------


def logits_of(out):
    return out.logits[0].float()


def compute_refs(spec, model, prompt, decode_ids, mtp_forward, log):
    refs = {}
    checks = {}
    mon = TopkMonitor()
    with torch.no_grad(), mon:
        out = model(input_ids=prompt, use_cache=True, output_hidden_states=True)
        refs["prompt_logits"] = logits_of(out)
        hs = [h[0].float() for h in out.hidden_states]
        final_hidden = out.hidden_states[-1]
        refs["final_hidden"] = hs[-1]
        cache = out.past_key_values
        dec = []
        for i in range(D):
            o = model(input_ids=decode_ids[i].view(1, 1), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            dec.append(o.logits[0, -1].float())
        refs["decode_logits"] = torch.stack(dec)
        if mtp_forward is not None:
            refs["mtp_logits"] = mtp_forward(final_hidden, prompt)[0].float()
    checks["topk_calls"] = mon.calls
    checks["topk_boundaries_checked"] = mon.boundaries
    checks["topk_min_rel_gap"] = None if math.isinf(mon.min_rel) else mon.min_rel
    checks["topk_min_abs_gap"] = None if math.isinf(mon.min_abs) else mon.min_abs

    # hidden states: HF returns L+1 entries: [0] = input of layer 0 (embeddings), [i] = output of layer i-1,
    # and the last one replaced by the post-final-norm hidden.
    shapes = {tuple(h.shape) for h in hs}
    if len(shapes) == 1:
        refs["hidden_states"] = torch.stack(hs)
        checks["hidden_states_layout"] = "stacked_all"
    else:
        refs["hidden_states"] = torch.stack(hs[:-1])
        checks["hidden_states_layout"] = "streams_without_final"

    # raw output of the last decoder layer (before the final norm)
    with torch.no_grad():
        text_model = model.model.language_model if hasattr(model.model, "language_model") else model.model
        L = text_config(model.config).num_hidden_layers
        grabbed = {}

        def hook(_m, _a, o):
            grabbed["o"] = o[0] if isinstance(o, tuple) else o

        hnd = text_model.layers[L - 1].register_forward_hook(hook)
        model(input_ids=prompt, use_cache=False)
        hnd.remove()
        refs["last_layer_output"] = grabbed["o"][0].float()

        # manual greedy with the cache
        out = model(input_ids=prompt, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[0, -1]
        greedy, gaps = [], []
        for _ in range(GREEDY_N):
            top2 = torch.topk(nxt.float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
            tok = int(torch.argmax(nxt))
            greedy.append(tok)
            o = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            nxt = o.logits[0, -1]
        checks["greedy_min_top2_gap"] = min(gaps)
        refs["_manual_greedy"] = torch.tensor(greedy, dtype=torch.int32)

        # decode with the cache vs. one full forward over prompt + decode ids
        full = model(input_ids=torch.cat([prompt, decode_ids.view(1, -1)], dim=1), use_cache=False)
        fl = full.logits[0].float()
        checks["decode_vs_full_forward_max_abs_diff"] = float((fl[T:] - refs["decode_logits"]).abs().max())
        checks["prompt_vs_longer_forward_max_abs_diff"] = float((fl[:T] - refs["prompt_logits"]).abs().max())
    return refs, checks


def logit_stats(x):
    p = torch.softmax(x, dim=-1)
    return {
        "std": float(x.std()),
        "mean_row_std": float(x.std(dim=-1).mean()),
        "mean_max_prob": float(p.max(dim=-1).values.mean()),
        "distinct_argmax": int(torch.unique(x.argmax(dim=-1)).numel()),
        "max_abs": float(x.abs().max()),
    }


def describe_tensors(refs, spec, cfg, layout):
    L = cfg.num_hidden_layers
    H = cfg.hidden_size
    d = {
        "prompt_ids": f"[T] int32: the prompt (random ids, seed {PROMPT_SEED})",
        "prompt_logits": "[T,V] float32: logits for every prompt position (one forward over the prompt)",
        "final_hidden": "[T,H] float32: post-final-norm hidden (what lm_head and the MTP consume)",
        "last_layer_output": "raw output of the last decoder layer, before the final norm: [T,H]"
        + (" ([T,hc_mult,H] residual streams for mHC)" if layout != "stacked_all" else ""),
        "decode_ids": f"[D] int32: ids fed one at a time after the prompt with the model's cache (seed {DECODE_SEED})",
        "decode_logits": "[D,V] float32: decode_logits[i] = logits after feeding decode_ids[i] at position T+i "
        "(cache holds the prompt and decode_ids[:i])",
        "greedy_ids": f"[{GREEDY_N}] int32: generate(prompt, do_sample=False, max_new_tokens={GREEDY_N}), new tokens only, "
        "no EOS",
    }
    if layout == "stacked_all":
        d["hidden_states"] = (
            f"[L+1,T,H] = [{L + 1},{T},{H}] float32: output_hidden_states=True stacked: [0] = embeddings "
            f"(input of layer 0), [i] = output of layer i-1 for i=1..L-1, [L] = post-final-norm hidden "
            f"(== final_hidden; the raw layer L-1 output is last_layer_output)"
        )
    else:
        d["hidden_states"] = (
            f"[L,T,hc_mult,H] float32: the first L entries of output_hidden_states (residual streams): [0] = "
            f"embedding copied into every stream (input of layer 0), [i] = output streams of layer i-1; HF's entry "
            f"L is the post-final-norm hidden, stored as final_hidden"
        )
    if "mtp_logits" in refs:
        d["mtp_logits"] = (
            "[T-1,V] float32: mtp_logits[p] for p=0..T-2: the MTP takes final_hidden[p] and embed(prompt_ids[p+1]) "
            "at position p (causal over the MTP sequence, its own cache) and predicts token p+2"
        )
    return d


# ----------------------------------------------------------------------------
# Build one fixture
# ----------------------------------------------------------------------------


def build_fixture(spec, out_root, device_note):
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    def log(msg):
        print(f"[{spec.name}] {msg}", flush=True)

    t0 = time.time()
    gen_prompt = torch.Generator().manual_seed(PROMPT_SEED)
    prompt = torch.randint(0, V, (1, T), generator=gen_prompt)
    gen_dec = torch.Generator().manual_seed(DECODE_SEED)
    decode_ids = torch.randint(0, V, (D,), generator=gen_dec)

    best = None
    attempts = []
    for attempt in range(MAX_ATTEMPTS):
        seed = spec.seed + 1000 * attempt
        torch.manual_seed(seed)
        model_cls, cfg = spec.make()
        model = model_cls._from_config(
            cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
        )
        model.eval()
        gen = torch.Generator().manual_seed(seed)
        tcfg = text_config(model.config)
        tied = bool(getattr(model.config, "tie_word_embeddings", False)) and (
            model.get_output_embeddings().weight is model.get_input_embeddings().weight
        )
        reinit(model, gen, tcfg.hidden_size, tied=tied, log=log if attempt == 0 else None)
        mtp = None
        if spec.mtp:
            mtp = build_mtp(spec, model, gen)
        if spec.store_dtype == "bfloat16":
            round_to_bf16(model)
            if mtp:
                round_to_bf16(mtp[0])
        refs, checks = compute_refs(spec, model, prompt, decode_ids, mtp[3] if mtp else None, log)
        rel = checks["topk_min_rel_gap"]
        ok = (rel is None or rel >= MIN_TOPK_REL_GAP) and checks["greedy_min_top2_gap"] >= MIN_GREEDY_GAP
        attempts.append({"seed": seed, "topk_min_rel_gap": rel, "greedy_min_top2_gap": checks["greedy_min_top2_gap"]})
        log(
            f"attempt {attempt} seed {seed}: topk min rel gap {rel}, greedy min gap "
            f"{checks['greedy_min_top2_gap']:.4g} -> {'ok' if ok else 'retry'}"
        )
        score = min(
            (rel / MIN_TOPK_REL_GAP) if rel is not None else math.inf,
            checks["greedy_min_top2_gap"] / MIN_GREEDY_GAP,
        )
        if best is None or score > best[0]:
            best = (score, seed, model, mtp, refs, checks)
        if ok:
            break
    _, seed, model, mtp, refs, checks = best
    tcfg = text_config(model.config)

    # generate() reference
    with torch.no_grad():
        gcfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=GREEDY_N,
            eos_token_id=None,
            pad_token_id=0,
            bos_token_id=None,
            use_cache=True,
        )
        try:
            seq = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=gcfg
            )
            greedy = seq[0, T:].to(torch.int32)
            checks["greedy_source"] = "generate"
        except Exception as e:
            log(f"generate() failed ({e!r}); using the manual cached greedy loop")
            greedy = refs["_manual_greedy"]
            checks["greedy_source"] = f"manual cached argmax loop (generate failed: {type(e).__name__})"
    manual = refs.pop("_manual_greedy")
    checks["greedy_generate_matches_manual_loop"] = bool(
        greedy.shape == manual.shape and torch.equal(greedy, manual)
    )
    if greedy.numel() != GREEDY_N:
        raise RuntimeError(f"generate returned {greedy.numel()} tokens")

    refs["prompt_ids"] = prompt[0].to(torch.int32)
    refs["decode_ids"] = decode_ids.to(torch.int32)
    refs["greedy_ids"] = greedy.to(torch.int32)

    # logits sanity
    stats = {"prompt_logits": logit_stats(refs["prompt_logits"]), "decode_logits": logit_stats(refs["decode_logits"])}
    if "mtp_logits" in refs:
        stats["mtp_logits"] = logit_stats(refs["mtp_logits"])
    for k, s in stats.items():
        log(
            f"{k}: std {s['std']:.3f}, mean row std {s['mean_row_std']:.3f}, mean max prob {s['mean_max_prob']:.3f}, "
            f"distinct argmax {s['distinct_argmax']}"
        )
        if s["mean_row_std"] < 0.2 or s["mean_max_prob"] > 0.95:
            raise RuntimeError(f"{k} look degenerate: {s}")
    hs_final_ok = True
    if checks["hidden_states_layout"] == "stacked_all":
        hs_final_ok = bool(torch.equal(refs["hidden_states"][-1], refs["final_hidden"]))
    checks["hidden_states_last_equals_final_hidden"] = hs_final_ok

    # ---- write the fixture ----
    outdir = os.path.join(out_root, spec.name)
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    if mtp:
        mtp[1]()  # attach so save_pretrained writes the MTP tensors with the checkpoint's names
    if spec.store_dtype == "bfloat16":
        model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
    model.save_pretrained(outdir)
    if spec.store_dtype == "bfloat16":
        model.to(torch.float32)
        model.config.dtype = torch.float32
    if mtp:
        mtp[2]()  # detach again
    files = sorted(os.listdir(outdir))
    if "model.safetensors" not in files:
        raise RuntimeError(f"save_pretrained wrote {files}, expected a single model.safetensors")

    with safe_open(os.path.join(outdir, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
    patterns = sorted({re.sub(r"\.\d+\.", ".N.", re.sub(r"\.\d+\.", ".N.", k)) for k in keys})
    log(f"model.safetensors: {len(keys)} tensors, dtypes {sorted(dtypes)}")
    for p_ in patterns:
        log(f"    {p_}")
    experts_format = "none"
    if any(re.search(r"experts\.\d+\.", k) for k in keys):
        experts_format = "per-expert (experts.{e}.{gate,up,down}_proj.weight or w1/w2/w3)"
    elif any("experts.gate_up_proj" in k for k in keys):
        experts_format = "fused (experts.gate_up_proj [E,2I,H], experts.down_proj [E,H,I])"
    mtp_keys = [k for k in keys if k.startswith("mtp.") or re.search(rf"layers\.{tcfg.num_hidden_layers}\.", k)]
    if spec.mtp and not mtp_keys:
        raise RuntimeError("MTP tensors missing from model.safetensors")

    # reload through from_pretrained and compare
    model_cls = type(model)
    with torch.no_grad():
        re_model = model_cls.from_pretrained(
            outdir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
        )
        re_model.eval()
        rl = re_model(input_ids=prompt).logits[0].float()
        checks["reload_max_abs_diff"] = float((rl - refs["prompt_logits"]).abs().max())
    log(f"reload via from_pretrained: max |dlogits| = {checks['reload_max_abs_diff']:.3g}")
    log(
        f"decode vs full forward: {checks['decode_vs_full_forward_max_abs_diff']:.3g}; "
        f"greedy generate == manual: {checks['greedy_generate_matches_manual_loop']}"
    )

    tensors = {k: v.contiguous() for k, v in refs.items()}
    save_file(tensors, os.path.join(outdir, "reference.safetensors"), metadata={"format": "pt"})

    import transformers as tf

    cfg_json = json.load(open(os.path.join(outdir, "config.json")))
    meta = {
        "name": spec.name,
        "model_type": spec.model_type,
        "architecture": type(model).__name__,
        "T": T,
        "D": D,
        "V": V,
        "H": tcfg.hidden_size,
        "num_hidden_layers": tcfg.num_hidden_layers,
        "greedy_new_tokens": GREEDY_N,
        "seeds": {"weights": seed, "prompt": PROMPT_SEED, "decode": DECODE_SEED, "attempts": attempts},
        "weights_dtype": "bfloat16" if spec.store_dtype == "bfloat16" else "float32",
        "reference_dtype": "float32",
        "compute": device_note,
        "versions": {
            "transformers": tf.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "config_is_text_nested": "text_config" in cfg_json,
        "model_safetensors": {
            "num_tensors": len(keys),
            "dtypes": sorted(dtypes),
            "experts_format": experts_format,
            "mtp_tensors": len(mtp_keys),
            "tensor_name_patterns": patterns,
        },
        "tensors": {
            k: {"shape": list(v.shape), "dtype": "I32" if v.dtype == torch.int32 else "F32"}
            for k, v in sorted(tensors.items())
        },
        "tensor_descriptions": describe_tensors(refs, spec, tcfg, checks["hidden_states_layout"]),
        "logit_stats": stats,
        "checks": checks,
        "options": spec.options,
        "notes": spec.notes
        + [
            "Weights were re-initialised after construction (transformers' default std 0.02 makes tiny models "
            "near-linear): linear weights N(0, g/sqrt(fan_in)) with g=1 (1.3 for q/k projections, 2 for lm_head), "
            "embeddings N(0,1) (N(0,2/sqrt(H)) when tied), norm weights 1+U(-0.3,0.3) (U(-0.3,0.3) for "
            "zero-centred 1+w norms), LayerNorm biases N(0,0.2), linear biases N(0,0.5), router weights "
            "N(0,2/sqrt(H)), e_score_correction_bias U(-0.2,0.2), decay parameters in a realistic range.",
            "References were computed in float32 on the CPU with eager attention and eager experts "
            "(no TF32, no fused kernels, no hub kernels).",
        ],
    }
    if mtp:
        meta["mtp"] = dict(mtp[4])
        meta["mtp"]["hidden_convention"] = (
            "post-final-norm: the MTP at position p consumes final_hidden[p] (the main model's hidden after its "
            "final norm, i.e. what lm_head sees)"
        )
        meta["mtp"]["num_tensors"] = len(mtp_keys)
    with open(os.path.join(outdir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=False)
        f.write("\n")

    size = sum(os.path.getsize(os.path.join(outdir, n)) for n in os.listdir(outdir))
    log(f"wrote {outdir} ({size / 1e6:.2f} MB) in {time.time() - t0:.1f}s")
    return size


def main():
    global torch, nn, transformers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "..", "testdata", "models")))
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    ap.add_argument("--list", action="store_true", help="list the fixture names and exit")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()

    if args.list:
        for s in SPECS:
            print(s.name)
        return 0

    import torch as _torch
    import torch.nn as _nn
    import transformers as _tf

    torch, nn, transformers = _torch, _nn, _tf
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in {x.name for x in SPECS}]
    if unknown:
        print(f"unknown fixture names: {unknown}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {_tf.__version__}, torch {torch.__version__}, out {args.out}", flush=True)
    device_note = f"cpu ({platform.machine()}), float32, torch.set_num_threads({args.threads})"

    ok, failed = [], []
    total = 0
    for spec in SPECS:
        if only and spec.name not in only:
            continue
        try:
            total += build_fixture(spec, args.out, device_note)
            ok.append(spec.name)
        except Exception:
            traceback.print_exc()
            failed.append(spec.name)
            print(f"[{spec.name}] FAILED", flush=True)
    print(f"\nOK: {ok}\nFAILED: {failed}\nwritten: {total / 1e6:.2f} MB", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
