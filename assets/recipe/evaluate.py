#!/usr/bin/env python3
"""Evaluate an exported tiny-SDAR folder: held-out masked loss/accuracy and sample decodes.

Weights are used as exported (bf16 upcast to fp32). Writes into --out (default: the model
folder):
  eval.json     masked-token loss / accuracy on held-out text at mask ratios 0.15, 0.5, 0.85,
                1.0 in the block-diffusion setting (earlier blocks clean, the current block
                partly masked), next to a unigram baseline (train-set token frequencies).
  samples.json  decodes with the algorithm of docs/decoding.md (B=4, S=4, full recompute of
                the sequence under the block-causal mask at every pass, no KV cache), greedy
                with `sequential`, `low_confidence_static`, `low_confidence_dynamic` (sdar
                mode, threshold 0.85), plus one sampled run per prompt with the
                generation_config settings (torch RNG: NOT the engine's ChaCha8 stream).
                Every step records the committed positions, their tokens and confidences.

Usage: python evaluate.py --model /tmp/tiny-sdar [--data work] [--out DIR]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train import bd_training_mask, block_causal_mask, load_exported  # noqa: E402

PROMPTS = [
    "OTHELLO.\n",  # 3 tokens: the first decode block holds the prompt tail
    "Shall I compare thee to a summer's day?\n",  # 12 tokens: whole blocks, no tail
    "FIRST CITIZEN.\nBefore we proceed any further, hear me speak.\n\nALL.\n",  # 19 tokens
]
RATIOS = [0.15, 0.5, 0.85, 1.0]


def log(*a):
    print(*a, flush=True)


# ============================================================== masked-token evaluation
@torch.no_grad()
def masked_eval(model, c, held, counts, L, batch, max_windows, seed, device):
    """Per ratio r: mask each position w.p. r (r=1: every position), clean context = earlier
    blocks, via the training dual-stream mask (identical to decoding block by block)."""
    n_win = (held.numel() - 1) // L
    if max_windows:
        n_win = min(n_win, max_windows)
    x_all = held[: n_win * L].view(n_win, L).to(device)
    train_mask = bd_training_mask(L, c.block_size, device)
    logp_uni = torch.log((counts + 1.0) / (counts + 1.0).sum()).to(device)  # add-one smoothing
    uni_top = int(torch.argmax(counts))
    pos = torch.arange(L, device=device).repeat(2)
    out = {}
    for r in RATIOS:
        g = torch.Generator(device=device)
        g.manual_seed(seed + int(r * 1000))
        tot = tot_u = 0.0
        n = cor = cor_u = 0
        for i in range(0, n_win, batch):
            x0 = x_all[i:i + batch]
            m = torch.rand(x0.shape, device=device, generator=g) < r if r < 1.0 else torch.ones_like(x0, dtype=torch.bool)
            xt = torch.where(m, torch.full_like(x0, c.mask_token_id), x0)
            h = model.hidden(torch.cat([xt, x0], 1), pos, train_mask)
            logits = model.logits(h[:, :L]).float()
            ce = F.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
            tot += ce[m].sum().item()
            n += int(m.sum())
            cor += int(((logits.argmax(-1) == x0) & m).sum())
            tot_u += (-logp_uni[x0[m]]).sum().item()
            cor_u += int((x0[m] == uni_top).sum())
        out[str(r)] = {
            "masked_tokens": n,
            "loss": round(tot / n, 4), "acc": round(cor / n, 4), "ppl": round(math.exp(tot / n), 2),
            "unigram_loss": round(tot_u / n, 4), "unigram_acc": round(cor_u / n, 4),
        }
        log(f"ratio {r:4.2f}: masked {n:6d}  loss {tot/n:.4f} acc {cor/n:.4f}  |  unigram loss "
            f"{tot_u/n:.4f} acc {cor_u/n:.4f}")
    return out, n_win


# ============================================================== decoding (docs/decoding.md)
def sample_position(logits, temperature, top_k, top_p, gen):
    """logits [V] f32 -> (token, confidence, entropy) as in docs/decoding.md."""
    if temperature == 0:
        p = torch.softmax(logits, -1)
        tok = int(torch.argmax(logits))  # first maximum = lowest id on a tie
        ent = float(-(p * torch.log(p.clamp_min(1e-30))).sum())
        return tok, float(p[tok]), ent
    z = logits / temperature
    if top_k and top_k > 0 and top_k < z.numel():
        kth = torch.topk(z, top_k).values[-1]
        z = torch.where(z < kth, torch.full_like(z, -math.inf), z)
    if top_p < 1.0:
        p = torch.softmax(z, -1)
        sp, idx = torch.sort(p, descending=True, stable=True)
        cum = torch.cumsum(sp, 0)
        keep_n = min(int((cum < top_p).sum()) + 1, p.numel())  # smallest prefix reaching p
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[idx[:keep_n]] = True
        z = torch.where(keep, z, torch.full_like(z, -math.inf))
    p = torch.softmax(z, -1)
    tok = int(torch.multinomial(p, 1, generator=gen))
    ent = float(-(p[p > 0] * torch.log(p[p > 0])).sum())
    return tok, float(p[tok]), ent


def schedule_sdar(m, S):
    S_ = min(S, m)
    base, extra = divmod(m, S_)
    return [base + (1 if i < extra else 0) for i in range(S_)]


def pick(strategy, masked, conf, k, threshold):
    """Indices (within the block) to commit; `masked` are the masked indices."""
    k = min(k, len(masked))
    by_conf = sorted(masked, key=lambda i: (-conf[i], i))
    if strategy == "sequential":
        return sorted(masked)[:k]
    if strategy == "low_confidence_static":
        return sorted(by_conf[:k])
    if strategy == "low_confidence_dynamic":  # sdar mode
        high = [i for i in masked if conf[i] > threshold]
        return sorted(high) if len(high) >= k else sorted(by_conf[:k])
    raise ValueError(strategy)


@torch.no_grad()
def decode(model, c, prompt_ids, B, S, N, strategy, threshold=0.85, temperature=0.0,
           top_k=0, top_p=1.0, seed=0, eos_ids=(), device="cpu"):
    MASK = c.mask_token_id
    P = len(prompt_ids)
    seq = list(prompt_ids)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    steps, blocks = [], []
    stop = "length"
    passes = 0
    first, last = P // B, (P + N - 1) // B
    for b in range(first, last + 1):
        start = b * B
        block = seq[start:start + B]
        block += [MASK] * (B - len(block))
        masked = [i for i in range(B) if start + i >= P]
        sched = schedule_sdar(len(masked), S)
        si = 0
        while masked:
            x = torch.tensor([seq[:start] + block], device=device)
            T = x.shape[1]
            logits = model(x, torch.arange(T, device=device), block_causal_mask(T, B, device))[0, start:start + B]
            passes += 1
            logits = logits.float().cpu()
            logits[:, MASK] = -math.inf  # the mask token is never sampled (docs/decoding.md)
            res = [sample_position(logits[i], temperature, top_k, top_p, gen) for i in range(B)]
            conf = [r[1] for r in res]
            k = sched[si] if si < len(sched) else 1
            chosen = pick(strategy, masked, conf, k, threshold)
            for i in chosen:
                block[i] = res[i][0]
            steps.append({
                "block": b, "step": si, "masked_before": [start + i for i in masked],
                "committed": [start + i for i in chosen],
                "tokens": [res[i][0] for i in chosen],
                "confidence": [round(conf[i], 4) for i in chosen],
                "entropy": [round(res[i][2], 4) for i in chosen],
            })
            masked = [i for i in masked if i not in chosen]
            si += 1
        seq = seq[:start] + block
        blocks.append({"block": b, "steps": si})
        if any(seq[p] in eos_ids for p in range(max(start, P), start + B)):
            stop = "eos"
            break
        if len(seq) - P >= N:
            break
    out = seq[P:P + N]
    for j, t in enumerate(out):
        if t in eos_ids:
            out = out[: j + 1]
            break
    return {"output_ids": out, "stop_reason": stop, "denoising_passes": passes,
            # as the engine counts: each finished block is stored by the next block's first pass
            "engine_forwards": passes, "blocks": blocks, "steps": steps}


def text_stats(ids):
    bigrams = list(zip(ids, ids[1:]))
    four = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    return {"distinct_2": round(len(set(bigrams)) / max(1, len(bigrams)), 3),
            "repeated_4gram_frac": round(1 - len(set(four)) / max(1, len(four)), 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join(HERE, "work"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq-len", type=int, default=0, help="eval window (0 = max_position_embeddings)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-windows", type=int, default=0, help="0 = the whole held-out stream")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-masked", action="store_true")
    args = ap.parse_args()
    out_dir = args.out or args.model
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)

    model, c = load_exported(args.model, device=dev, dtype=torch.float32)
    with open(os.path.join(args.model, "generation_config.json")) as f:
        gcfg = json.load(f)
    eos = gcfg.get("eos_token_id", c.eos_token_id)
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"loaded {args.model}: {n_params:,} params on {dev}")

    report = {"model_dir": os.path.abspath(args.model), "params": n_params,
              "config": {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads",
                                                     "head_dim", "intermediate_size", "block_size")}}
    summ = os.path.join(args.model, "train_summary.json")
    if os.path.exists(summ):
        with open(summ) as f:
            report["train"] = json.load(f)

    if not args.skip_masked:
        held = torch.from_numpy(np.load(os.path.join(args.data, "heldout.npy")).astype(np.int64))
        train = np.load(os.path.join(args.data, "train.npy")).astype(np.int64)
        counts = torch.from_numpy(np.bincount(train, minlength=c.vocab_size)).double()
        L = args.seq_len or c.max_position_embeddings
        res, n_win = masked_eval(model, c, held, counts, L, args.batch, args.max_windows, args.seed, dev)
        report["heldout_masked"] = {"windows": n_win, "window_len": L,
                                    "setting": "per position mask w.p. ratio; earlier blocks clean "
                                               "(BD3-LM dual-stream mask); loss = mean CE over masked",
                                    "ratios": res}

    B = gcfg.get("block_length", c.block_size)
    S = gcfg.get("denoising_steps", 4)
    thr = gcfg.get("confidence_threshold", 0.85)
    runs = [("sequential", 0.0, 0, 1.0), ("low_confidence_static", 0.0, 0, 1.0),
            ("low_confidence_dynamic", 0.0, 0, 1.0),
            (gcfg.get("remasking_strategy", "low_confidence_dynamic"), gcfg.get("temperature", 0.7),
             gcfg.get("top_k", 0), gcfg.get("top_p", 1.0))]
    samples = {"algorithm": "docs/decoding.md; full recompute under the block-causal mask each pass",
               "block_length": B, "denoising_steps": S, "threshold": thr,
               "max_new_tokens": args.max_new_tokens, "mask_token_id": c.mask_token_id,
               "eos_token_id": list(eos_ids), "samples": []}
    summary = {}
    for prompt in PROMPTS:
        pids = tok.encode(prompt).ids
        for strat, temp, tk, tp in runs:
            r = decode(model, c, pids, B, S, args.max_new_tokens, strat, thr, temp, tk, tp,
                       seed=args.seed, eos_ids=eos_ids, device=dev)
            text = tok.decode(r["output_ids"], skip_special_tokens=False)
            sampler = "greedy" if temp == 0 else f"temperature {temp}, top_k {tk}, top_p {tp} (torch RNG seed {args.seed})"
            st = text_stats(r["output_ids"])
            entry = {"prompt": prompt, "prompt_ids": pids, "strategy": strat, "sampler": sampler,
                     "text": text, **st, **r}
            samples["samples"].append(entry)
            key = f"{strat} / {'greedy' if temp == 0 else 'sampled'}"
            summary.setdefault(key, []).append({"passes": r["denoising_passes"], **st})
            log(f"\n=== {prompt!r} | {strat} | {sampler} | {r['denoising_passes']} passes, "
                f"stop {r['stop_reason']}\n{prompt}{text}")
    report["samples_summary"] = {
        k: {"mean_denoising_passes": round(float(np.mean([x["passes"] for x in v])), 1),
            "mean_distinct_2": round(float(np.mean([x["distinct_2"] for x in v])), 3),
            "mean_repeated_4gram_frac": round(float(np.mean([x["repeated_4gram_frac"] for x in v])), 3)}
        for k, v in summary.items()}
    report["eval_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
        json.dump(samples, f, indent=1)
    log(f"\nwrote {out_dir}/eval.json and samples.json in {time.time()-t0:.0f}s")


if __name__ == "__main__":
    main()
