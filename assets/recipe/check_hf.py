#!/usr/bin/env python3
"""Cross-checks of an export folder (CPU, fp32; needs `transformers`):

1. transformers' Qwen3ForCausalLM loads model.safetensors (config.json with model_type
   overridden to qwen3) and gives the same logits as train.py's model under a causal mask:
   proves the tensor names, the tying and the math (RMSNorm, q/k norm, RoPE, GQA) match.
2. The same with the 4-D block-causal mask passed to transformers (if that version takes one).
3. train.py's dual-stream training forward [x_t ; x_0] gives, for every block, the logits of a
   plain block-causal forward over (clean earlier blocks + that noisy block): the training
   mask matches what the decoder sees.

Usage: python check_hf.py --model /tmp/tiny-sdar [--data work]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train import (add_block_noise, bd_training_mask, block_causal_mask, causal_mask,  # noqa: E402
                   dual_stream_logits, load_exported)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join(HERE, "work"))
    ap.add_argument("--tol", type=float, default=2e-4)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, c = load_exported(args.model)
    held = np.load(os.path.join(args.data, "heldout.npy")).astype(np.int64)
    ok = True

    # ---- 3. dual-stream training mask == block-causal decoding view
    L = 32
    x0 = torch.from_numpy(held[1000:1000 + 2 * L].reshape(2, L).copy())
    g = torch.Generator()
    g.manual_seed(0)
    xt, m, _ = add_block_noise(x0, c.block_size, c.mask_token_id, 1e-3, g)
    with torch.no_grad():
        dual = dual_stream_logits(model, x0, xt, bd_training_mask(L, c.block_size))
        worst = 0.0
        for b in range(L // c.block_size):
            s, e = b * c.block_size, (b + 1) * c.block_size
            x = torch.cat([x0[:, :s], xt[:, s:e]], 1)
            ref = model(x, torch.arange(e), block_causal_mask(e, c.block_size))[:, s:e]
            worst = max(worst, (ref - dual[:, s:e]).abs().max().item())
    print(f"[dual-stream vs per-block block-causal] max |diff| {worst:.2e}")
    ok &= worst < args.tol

    # ---- 1./2. transformers Qwen3
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    cfg["model_type"] = "qwen3"
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    cfg.pop("torch_dtype", None)
    hf_cfg = Qwen3Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    hf_cfg._attn_implementation = "eager"
    hf = Qwen3ForCausalLM.from_pretrained(args.model, config=hf_cfg, dtype=torch.float32)
    hf.eval()
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    T = 23
    ids = torch.from_numpy(held[2000:2000 + T].copy())[None]
    with torch.no_grad():
        ours = model(ids, torch.arange(T), causal_mask(T))
        theirs = hf(input_ids=ids).logits
    d = (ours - theirs).abs().max().item()
    print(f"[transformers {transformers.__version__} Qwen3ForCausalLM, causal] max |diff| {d:.2e} "
          f"(logit scale {theirs.abs().max().item():.1f})")
    ok &= d < args.tol

    try:
        ids2 = ids.clone()
        ids2[0, -3:] = c.mask_token_id
        bc = block_causal_mask(T, c.block_size)
        four_d = torch.zeros(1, 1, T, T).masked_fill(~bc, torch.finfo(torch.float32).min)
        with torch.no_grad():
            ours = model(ids2, torch.arange(T), bc)
            theirs = hf(input_ids=ids2, attention_mask=four_d, position_ids=torch.arange(T)[None]).logits
        d = (ours - theirs).abs().max().item()
        print(f"[transformers Qwen3ForCausalLM, 4-D block-causal mask, MASK ids in last block] max |diff| {d:.2e}")
        ok &= d < args.tol
    except Exception as e:  # older/newer mask plumbing: informative only
        print(f"[transformers 4-D mask] skipped: {type(e).__name__}: {e}")

    print("ALL OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
