#!/usr/bin/env python3
"""Write the Rust engine's logits golden from an export folder.

Output (safetensors, default tests/fixtures/tiny-sdar-golden.safetensors in this repo):
  input_ids          int64   [2, 24]        held-out tokens; the last block (positions 20..23)
                                            holds <|MASK|> ids: row 0 at positions 21 and 23,
                                            row 1 at all of 20..23
  position_ids       int64   [24]           0..23 (the same for both rows)
  block_causal_mask  uint8   [24, 24]       1 where query i may attend key j: j // 4 <= i // 4
  logits             float32 [2, 24, 4096]  model logits for input_ids under that mask
Header metadata: one key, "info", a JSON string (sorted keys) with block_size, mask_token_id,
eos_token_id, vocab_size, compute ("float64 from the bf16 weights upcast; RoPE angles in
float32 as transformers") and the float32-vs-float64 max difference. (One key only, because
safetensors writes __metadata__ from a hash map: several keys would make the bytes vary.)

The logits of the last block are what one denoising pass of docs/decoding.md returns when the
first 5 blocks are committed: the engine's forward must reproduce them (prefill + pass).

Usage: python golden.py --model /tmp/tiny-sdar [--data work] [--out PATH]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train import block_causal_mask, load_exported  # noqa: E402

DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures",
                                            "tiny-sdar-golden.safetensors"))
T = 24
STARTS = (1203, 40117)  # offsets into heldout.npy


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join(HERE, "work"))
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    from safetensors.torch import save_file
    import hashlib

    torch.set_num_threads(1)  # fixed reduction order: regenerating gives the same bytes
    with open(os.path.join(args.model, "model.safetensors"), "rb") as f:
        weights_sha = hashlib.sha256(f.read()).hexdigest()

    model64, c = load_exported(args.model, dtype=torch.float64)
    model32, _ = load_exported(args.model, dtype=torch.float32)
    held = np.load(os.path.join(args.data, "heldout.npy")).astype(np.int64)
    ids = torch.from_numpy(np.stack([held[s:s + T] for s in STARTS]))
    M = c.mask_token_id
    ids[0, 21] = M
    ids[0, 23] = M
    ids[1, 20:24] = M
    pos = torch.arange(T)
    mask = block_causal_mask(T, c.block_size)
    with torch.no_grad():
        l64 = model64(ids, pos, mask)
        l32 = model32(ids, pos, mask)
    diff = (l64 - l32.double()).abs().max().item()
    logits = l64.float().contiguous()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    meta = {
        "block_size": c.block_size, "mask_token_id": M, "eos_token_id": c.eos_token_id,
        "vocab_size": c.vocab_size, "seq_len": T, "heldout_offsets": list(STARTS),
        "compute": "float64 from the bf16 weights upcast; RoPE angles in float32 as transformers",
        "f32_vs_f64_max_abs_diff": f"{diff:.3e}",
        "model_safetensors_sha256": weights_sha,
    }
    save_file({"input_ids": ids.contiguous(), "position_ids": pos.contiguous(),
               "block_causal_mask": mask.to(torch.uint8).contiguous(), "logits": logits},
              args.out, metadata={"info": json.dumps(meta, sort_keys=True)})
    print(f"wrote {args.out} ({os.path.getsize(args.out):,} bytes)")
    print(json.dumps(meta, indent=1))
    print("input_ids:", ids.tolist())
    print("argmax of the last block:", logits[:, 20:].argmax(-1).tolist())


if __name__ == "__main__":
    main()
