#!/usr/bin/env python3
"""Train unmask's tiny SDAR (block-diffusion, Qwen3-architecture) model and export it.

Self-contained: PyTorch + numpy + safetensors (no transformers, no network).

Model: exactly the Qwen3 decoder math (so a Qwen3 implementation loads the export):
  embed -> N x [RMSNorm -> q/k/v proj -> per-head RMSNorm(q), RMSNorm(k) -> RoPE
  (rotate_half) -> GQA attention (scale 1/sqrt(head_dim), explicit boolean mask) ->
  o_proj -> residual -> RMSNorm -> down(silu(gate(x)) * up(x)) -> residual] ->
  RMSNorm -> lm_head tied to the embedding.
Logits at position i predict the token AT position i (SDAR / LLaDA convention, no shift).

Objective: SDAR / BD3-LM block diffusion, block size 4. A clean window x0 of L tokens is
cut into blocks of 4; per block a ratio t ~ U(eps, 1] is drawn and every position is
replaced by <|MASK|> with probability t (a block that drew no mask gets one at a random
position). The model sees the concatenation [x_t ; x_0] (2L tokens, positions 0..L-1 for
both halves) under the BD3-LM / SDAR training mask:
  noisy block b -> noisy block b (both directions) and clean blocks < b
  clean block b -> clean blocks <= b   (= the block-causal mask used at inference)
Loss: cross-entropy on the masked noisy positions only; by default the plain mean over
masked tokens (--loss-weight mean); --loss-weight elbo uses SDAR's sum(CE / t) / tokens.

Usage:
  python train.py --data work --out /tmp/tiny-sdar --minutes 7          # GPU
  python train.py --data work --out /tmp/smoke --preset smoke --steps 40  # CPU smoke
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(*a, flush=True)


# ============================================================== model (Qwen3 math)
@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    block_size: int = 4
    mask_token_id: int = 4095
    eos_token_id: int = 4094
    bos_token_id: int = 4094
    dropout: float = 0.0  # training only; not part of the exported architecture

    @classmethod
    def from_hf(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "rope_theta" not in kw and isinstance(d.get("rope_parameters"), dict):
            kw["rope_theta"] = d["rope_parameters"]["rope_theta"]
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        kw["dropout"] = 0.0
        return cls(**kw)


PRESETS = {
    # ~7.3M params, 14.7 MB as bf16 safetensors
    "default": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    # CPU smoke test shape
    "smoke": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in fp32 (or fp64), cast back, then multiply by the weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(position_ids, head_dim, theta, dtype):
    """transformers' Qwen3RotaryEmbedding ('default' rope): angles computed in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                             device=position_ids.device).float() / head_dim))
    freqs = position_ids[..., None].float() * inv_freq  # [..., T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.num_attention_heads // c.num_key_value_heads
        if rep > 1:  # transformers' repeat_kv: query head h uses kv head h // rep
            k = k[:, :, None].expand(B, c.num_key_value_heads, rep, T, c.head_dim).reshape(B, -1, T, c.head_dim)
            v = v[:, :, None].expand(B, c.num_key_value_heads, rep, T, c.head_dim).reshape(B, -1, T, c.head_dim)
        dt = v.dtype
        o = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v, attn_mask=mask,
                                           scale=c.head_dim ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        self.p = c.dropout

    def forward(self, x, cos, sin, mask):
        h = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if self.training and self.p > 0:
            h = F.dropout(h, self.p, True)
        x = x + h
        h = self.mlp(self.post_attention_layernorm(x))
        if self.training and self.p > 0:
            h = F.dropout(h, self.p, True)
        return x + h


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class SDARForCausalLM(nn.Module):
    """State-dict keys are the Qwen3 / SDAR ones (model.layers.N....); lm_head is tied."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.model = Backbone(c)
        self.reset_parameters()

    def reset_parameters(self, std=0.02):
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.c.num_hidden_layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def hidden(self, input_ids, position_ids, mask):
        """input_ids [B,T]; position_ids [T] or [B,T]; mask bool [T,T] / [B,1,T,T], True = attend."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.c.head_dim, self.c.rope_theta, x.dtype)
        if cos.dim() == 2:
            cos, sin = cos[None, None], sin[None, None]
        else:
            cos, sin = cos[:, None], sin[:, None]
        if mask.dim() == 2:
            mask = mask[None, None]
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return x

    def logits(self, h):
        return F.linear(self.model.norm(h), self.model.embed_tokens.weight)

    def forward(self, input_ids, position_ids=None, mask=None):
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)
        if mask is None:
            mask = block_causal_mask(T, self.c.block_size, input_ids.device)
        return self.logits(self.hidden(input_ids, position_ids, mask))


# ============================================================== masks
def block_causal_mask(T, block, device=None):
    """Inference mask: query in block b sees keys in blocks 0..b (both ways inside b)."""
    b = torch.arange(T, device=device) // block
    return b[:, None] >= b[None, :]


def causal_mask(T, device=None):
    i = torch.arange(T, device=device)
    return i[:, None] >= i[None, :]


def bd_training_mask(L, block, device=None):
    """SDAR's block_diff_mask for [x_t (0..L-1) ; x_0 (L..2L-1)], True = attend."""
    idx = torch.arange(2 * L, device=device)
    x0 = idx >= L
    blk = torch.where(x0, idx - L, idx) // block
    q0, k0 = x0[:, None], x0[None, :]
    qb, kb = blk[:, None], blk[None, :]
    diag = (qb == kb) & (q0 == k0)            # noisy<->noisy and clean<->clean inside a block
    offset = (qb > kb) & k0 & ~q0             # noisy block b -> clean blocks < b
    causal = (qb >= kb) & k0 & q0             # clean block b -> clean blocks <= b
    return diag | offset | causal


def add_block_noise(x0, block, mask_id, eps, gen):
    """Per block t ~ U(eps,1]; mask each position w.p. t; force >= 1 mask per block."""
    B, L = x0.shape
    nb = L // block
    dev = x0.device
    t = eps + (1 - eps) * torch.rand(B, nb, 1, device=dev, generator=gen)
    m = torch.rand(B, nb, block, device=dev, generator=gen) < t
    force = torch.randint(0, block, (B, nb, 1), device=dev, generator=gen)
    force = torch.arange(block, device=dev).view(1, 1, block) == force
    m = m | (force & ~m.any(-1, keepdim=True))
    m = m.view(B, L)
    tt = t.expand(B, nb, block).reshape(B, L)
    xt = torch.where(m, torch.full_like(x0, mask_id), x0)
    return xt, m, tt


def dual_stream_logits(model, x0, xt, train_mask):
    """Logits on the noisy half of [x_t ; x_0] (the only half that has a loss)."""
    B, L = x0.shape
    pos = torch.arange(L, device=x0.device).repeat(2)
    h = model.hidden(torch.cat([xt, x0], dim=1), pos, train_mask)
    return model.logits(h[:, :L])


# ============================================================== export
def hf_config(c: ModelConfig):
    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "max_position_embeddings": c.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": c.num_hidden_layers,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "block_size": c.block_size,
        "mask_token_id": c.mask_token_id,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.eos_token_id,
    }


GENERATION_DEFAULTS = {
    "block_length": 4,
    "denoising_steps": 4,
    "do_sample": True,
    "temperature": 0.7,
    "top_k": 40,
    "top_p": 0.95,
    "remasking_strategy": "low_confidence_dynamic",
    "confidence_threshold": 0.85,
    "eb_threshold": 0.35,
    "max_new_tokens": 256,
}


def export(model, c: ModelConfig, data_dir, out_dir, extra=None):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    assert not any(k.startswith("lm_head") for k in sd)
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    gen = {"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
           "pad_token_id": c.eos_token_id, "mask_token_id": c.mask_token_id, **GENERATION_DEFAULTS}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(data_dir, name), os.path.join(out_dir, name))
    if extra is not None:
        with open(os.path.join(out_dir, "train_summary.json"), "w") as f:
            json.dump(extra, f, indent=2)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log(f"exported to {out_dir}: model.safetensors {size:,} bytes ({size/1e6:.2f} MB)")
    return size


def load_exported(path, device="cpu", dtype=torch.float32):
    """Model from an export folder, bf16 weights upcast to `dtype`."""
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as f:
        c = ModelConfig.from_hf(json.load(f))
    model = SDARForCausalLM(c)
    sd = load_file(os.path.join(path, "model.safetensors"))
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    model.to(device=device, dtype=dtype).eval()
    return model, c


# ============================================================== training
def param_count(model):
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def heldout_loss(model, batches, train_mask, autocast):
    """Masked CE / accuracy on fixed held-out (x0, xt, m) batches."""
    was = model.training
    model.eval()
    tot, n, correct = 0.0, 0, 0
    for x0, xt, m in batches:
        with autocast():
            logits = dual_stream_logits(model, x0, xt, train_mask)
        ce = F.cross_entropy(logits.float().flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
        tot += (ce * m).sum().item()
        n += m.sum().item()
        correct += ((logits.argmax(-1) == x0) & m).sum().item()
    model.train(was)
    return tot / max(n, 1), correct / max(n, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "work"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--hidden", type=int), ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int), ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int), ap.add_argument("--intermediate", type=int)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seq-len", type=int, default=512, help="clean tokens per window (model sees 2x)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--minutes", type=float, default=7.0, help="wall-clock budget of the training loop")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0 = time only)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--eps", type=float, default=1e-3, help="lower bound of the mask ratio t")
    ap.add_argument("--loss-weight", default="mean", choices=["mean", "elbo"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=float, default=30.0, help="seconds between held-out evals")
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--keep", default="best", choices=["best", "last"],
                    help="export the weights with the best held-out loss, or the last ones")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    t_start = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    with open(os.path.join(args.data, "meta.json")) as f:
        meta = json.load(f)
    shape = dict(PRESETS[args.preset])
    for k, a in [("hidden_size", "hidden"), ("num_hidden_layers", "layers"), ("num_attention_heads", "heads"),
                 ("num_key_value_heads", "kv_heads"), ("head_dim", "head_dim"),
                 ("intermediate_size", "intermediate")]:
        if getattr(args, a) is not None:
            shape[k] = getattr(args, a)
    c = ModelConfig(vocab_size=meta["vocab_size"], mask_token_id=meta["mask_token_id"],
                    eos_token_id=meta["eos_token_id"], bos_token_id=meta["eos_token_id"],
                    rope_theta=args.rope_theta, max_position_embeddings=args.seq_len,
                    dropout=args.dropout, **shape)
    assert args.seq_len % c.block_size == 0

    train = torch.from_numpy(np.load(os.path.join(args.data, "train.npy")).astype(np.int64)).to(dev)
    held = torch.from_numpy(np.load(os.path.join(args.data, "heldout.npy")).astype(np.int64)).to(dev)
    L = args.seq_len

    model = SDARForCausalLM(c).to(dev)
    n_params = param_count(model)
    n_embed = c.vocab_size * c.hidden_size
    # Training FLOPs per step (forward+backward ~ 3x forward): matmuls on 2L tokens, the tied
    # lm_head on the L noisy ones, attention scores+values over the 2L x 2L mask (dense).
    attn_flops = 4 * (2 * L) ** 2 * c.num_attention_heads * c.head_dim * c.num_hidden_layers
    step_flops = 3 * args.batch * (2 * (n_params - n_embed) * 2 * L + 2 * n_embed * L + attn_flops)
    log(f"model: {n_params:,} params ({n_params*2/1e6:.2f} MB bf16), {c}")
    log(f"data: train {train.numel():,} tokens, held-out {held.numel():,}; window {L} (+{L} noisy), "
        f"batch {args.batch} -> {args.batch*L:,} clean tokens/step, {step_flops/1e12:.2f} TFLOP/step")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
    opt_kw = dict(lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    if cuda:
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    train_mask = bd_training_mask(L, c.block_size, dev)
    fwd = dual_stream_logits
    if args.compile:
        fwd = torch.compile(dual_stream_logits, dynamic=False)

    def autocast():
        if cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    # Fixed held-out batches: non-overlapping windows, masks from a separate seeded stream.
    hgen = torch.Generator(device=dev)
    hgen.manual_seed(args.seed + 1)
    n_win = min(args.eval_windows, (held.numel() - 1) // L)
    starts = torch.linspace(0, held.numel() - L - 1, n_win).long().to(dev)
    hx0 = held[starts[:, None] + torch.arange(L, device=dev)]
    hbatches = []
    for i in range(0, n_win, args.batch):
        x0 = hx0[i:i + args.batch]
        xt, m, _ = add_block_noise(x0, c.block_size, c.mask_token_id, args.eps, hgen)
        hbatches.append((x0, xt, m))

    budget = args.minutes * 60.0
    max_steps = args.steps if args.steps > 0 else None
    warmup = min(args.warmup, max(1, (max_steps or 10**9) // 10))
    arangeL = torch.arange(L, device=dev)

    def lr_at(step, elapsed):
        prog = elapsed / budget
        if max_steps:
            prog = max(prog, step / max_steps)
        prog = min(prog, 1.0)
        w = min(1.0, (step + 1) / warmup)
        return args.lr * w * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))

    best = (float("inf"), -1)
    best_state = None
    history = []
    model.train()
    step = 0
    t0 = time.time()
    last_eval = t0
    tok_since, t_since = 0, t0
    log(f"setup took {t0 - t_start:.1f}s; training for {args.minutes} min"
        + (f" or {max_steps} steps" if max_steps else ""))

    def do_eval(tag):
        nonlocal best, best_state
        hl, ha = heldout_loss(model, hbatches, train_mask, autocast)
        improved = hl < best[0]
        if improved:
            best = (hl, step)
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        history.append({"step": step, "time_s": round(time.time() - t0, 1), "heldout_loss": round(hl, 4),
                        "heldout_acc": round(ha, 4)})
        log(f"[eval{tag}] step {step} t {time.time()-t0:.0f}s held-out masked loss {hl:.4f} "
            f"acc {ha:.4f}{' *best*' if improved else ''}")

    while True:
        elapsed = time.time() - t0
        if elapsed >= budget or (max_steps and step >= max_steps):
            break
        lr = lr_at(step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        s = torch.randint(0, train.numel() - L, (args.batch,), device=dev, generator=gen)
        x0 = train[s[:, None] + arangeL]
        xt, m, tt = add_block_noise(x0, c.block_size, c.mask_token_id, args.eps, gen)
        with autocast():
            logits = fwd(model, x0, xt, train_mask)
        ce = F.cross_entropy(logits.float().flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
        mf = m.float()
        if args.loss_weight == "mean":
            loss = (ce * mf).sum() / mf.sum()
        else:
            loss = (ce * mf / tt).sum() / x0.numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        tok_since += args.batch * L
        if step % args.log_every == 0 or step == 1:
            with torch.no_grad():
                acc = ((logits.argmax(-1) == x0) & m).sum() / m.sum()
            lv, av = loss.item(), acc.item()
            now = time.time()
            tps = tok_since / (now - t_since)
            log(f"step {step:6d} t {now-t0:6.1f}s lr {lr:.2e} loss {lv:.4f} masked-acc {av:.4f} "
                f"{tps/1e3:8.1f}k clean tok/s {tps * step_flops / (args.batch * L) / 1e12:6.1f} TFLOP/s")
            tok_since, t_since = 0, now
            if not math.isfinite(lv):
                raise SystemExit("loss is not finite")
        if time.time() - last_eval >= args.eval_every:
            do_eval("")
            last_eval = time.time()

    train_time = time.time() - t0
    do_eval(" final")
    log(f"trained {step} steps, {step*args.batch*L:,} clean tokens "
        f"({step*args.batch*L/train.numel():.1f} epochs) in {train_time:.0f}s; "
        f"best held-out {best[0]:.4f} at step {best[1]}")
    if args.keep == "best" and best_state is not None:
        model.load_state_dict(best_state)
    summary = {
        "steps": step, "train_seconds": round(train_time, 1), "clean_tokens": step * args.batch * L,
        "epochs": round(step * args.batch * L / train.numel(), 2), "params": n_params,
        "kept": args.keep, "best_heldout_loss": round(best[0], 4), "best_step": best[1],
        "history": history, "args": vars(args),
    }
    export(model.float(), c, args.data, args.out, summary)
    log(f"total wall {time.time()-t_start:.0f}s")


if __name__ == "__main__":
    main()
