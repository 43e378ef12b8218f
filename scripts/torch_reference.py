#!/usr/bin/env python3
"""PyTorch reference of unmask's decode, for speed comparisons (docs/perf.md).

The same algorithm as docs/decoding.md with transformers' Qwen3ForCausalLM, random weights of
a named shape (the shapes of `unmask bench --random-init`), on one device:
  - whole prompt blocks prefilled into a DynamicCache under an additive block-causal mask;
  - per block: up to `steps` denoising passes over the block (masks included) that attend to
    the cache and the whole block (explicit all-zero additive mask), after which the cache is
    cropped back (nothing stored), then one commit pass that stores the block's K/V;
  - greedy sampler per position (mask token suppressed): argmax, its softmax probability and
    the entropy; strategy low_confidence_static with the sdar schedule (or sequential).
No EOS stop: every decode runs to --max-new-tokens, as `unmask bench` does.

Timing: CUDA events around every forward (ms/forward, median), and the wall time of each whole
decode with a synchronize at the end (tokens/s, forwards/s). Warm-up decodes first.

Runs with the GPU host's python3 (torch 2.11, transformers 5.17; no network):
    python3 scripts/torch_reference.py --shape sdar-1.7b --json out.json
and on a CPU (wall clock around every forward instead of CUDA events; torch's own CPU
kernels, bf16 weights by default as a checkpoint ships them, every core unless --threads):
    python3 scripts/torch_reference.py --shape sdar-1.7b --device cpu --max-new-tokens 16 --repeat 2
    python3 scripts/torch_reference.py --shape tiny --device cpu --dtype f32 --max-new-tokens 16
(on a machine without them: python3 -m venv .venv && .venv/bin/pip install torch transformers,
then .venv/bin/python in place of python3). docs/perf.md's CPU section puts these beside
`unmask bench` on the same shape, run on the same machine at the same time.
"""

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

# name: (hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied, mask id)
SHAPES = {
    "tiny": (64, 2, 4, 2, 16, 160, 354, False, 353),
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936, True, 151669),
    "sdar-1.7b": (2048, 28, 16, 8, 128, 6144, 151936, False, 151669),
    "sdar-4b": (2560, 36, 32, 8, 128, 9728, 151936, False, 151669),
    "sdar-8b": (4096, 36, 32, 8, 128, 12288, 151936, False, 151669),
}
# MoE shapes (--compile or --static only): + (experts, top-k, moe intermediate)
MOE_SHAPES = {
    "tiny-moe": (64, 3, 4, 2, 16, 160, 354, False, 353, 8, 3, 48),
    "moe-small": (1024, 8, 16, 4, 128, 3072, 151936, False, 151669, 64, 8, 512),
    "sdar-30b-a3b": (2048, 48, 32, 4, 128, 6144, 151936, False, 151669, 128, 8, 768),
}


def make_model(shape, device, dtype, attn):
    h, layers, heads, kvh, hd, inter, vocab, tied, mask_id = SHAPES[shape]
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kvh,
        head_dim=hd,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=tied,
        attention_bias=False,
        use_sliding_window=False,
    )
    # transformers 5 keeps the RoPE base in rope_parameters
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = 1_000_000.0
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    rot = model.model.rotary_emb
    inv32 = rot.inv_freq.detach().clone().float()
    model = model.to(device=device, dtype=dtype).eval()
    # .to(bf16) also casts the RoPE buffer; keep it in f32 as a checkpoint load would
    rot.inv_freq = inv32.to(device)
    if hasattr(rot, "original_inv_freq"):
        rot.original_inv_freq = inv32.to(device)
    inv = rot.inv_freq.float().cpu()
    want = 1.0 / (1e6 ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    assert torch.allclose(inv, want, rtol=1e-6), "RoPE base is not 1e6"
    return model, mask_id, vocab


def block_causal_mask(q_len, kv_len, block, q_offset, dtype, device):
    """Additive [1, 1, q_len, kv_len] mask: 0 where allowed, dtype min where not."""
    qb = (torch.arange(q_len, device=device) + q_offset) // block
    kb = torch.arange(kv_len, device=device) // block
    allowed = kb[None, :] <= qb[:, None]
    m = torch.zeros(q_len, kv_len, dtype=dtype, device=device)
    m[~allowed] = torch.finfo(dtype).min
    return m[None, None]


def scheduled(step, block, steps):
    """The `sdar` schedule (docs/decoding.md): generate.py's get_num_transfer_tokens(block, steps),
    the same counts in every block (the caller caps them at the masks left)."""
    base, extra = divmod(block, steps)
    return base + (1 if step < extra else 0)


@torch.no_grad()
def decode(model, mask_id, prompt, args, dev, dtype, events):
    """One decode; returns (output ids, forwards, steps). `events` collects (kind, start, end)."""
    B, S, N = args.block, args.steps, args.max_new_tokens
    P = len(prompt)
    first_block = P // B
    end_blocks = (P + N + B - 1) // B
    cache = DynamicCache(config=model.config)
    forwards = steps_total = 0

    def timed(kind, **kw):
        if dev.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = model(**kw)
            b.record()
            events.append((kind, a, b))
        else:
            t0 = time.perf_counter()
            out = model(**kw)
            events.append((kind, t0, time.perf_counter()))
        return out

    if first_block > 0:
        L = first_block * B
        timed(
            "prefill",
            input_ids=torch.tensor([prompt[:L]], device=dev),
            attention_mask=block_causal_mask(L, L, B, 0, dtype, dev),
            position_ids=torch.arange(L, device=dev)[None],
            past_key_values=cache,
            use_cache=True,
        )
        forwards += 1
    output = []
    for blk in range(first_block, end_blocks):
        start = blk * B
        cells = [prompt[p] if p < P else mask_id for p in range(start, start + B)]
        masked = [start + i >= P for i in range(B)]
        pos = torch.arange(start, start + B, device=dev)[None]
        full = torch.zeros(1, 1, B, start + B, dtype=dtype, device=dev)
        step = 0
        while any(masked):
            out = timed(
                "denoise",
                input_ids=torch.tensor([cells], device=dev),
                attention_mask=full,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
            )
            cache.crop(-B)  # a denoising pass stores nothing (negative: drop the last B, in every 5.x)
            assert cache.get_seq_length() == start
            forwards += 1
            z = out.logits[0].float()
            z[:, mask_id] = float("-inf")
            p = torch.softmax(z, dim=-1)
            conf, tok = p.max(dim=-1)
            _entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
            conf, tok = conf.tolist(), tok.tolist()
            cand = [i for i in range(B) if masked[i]]
            k = min(max(1, scheduled(step, B, S)), len(cand))
            if args.strategy == "sequential":
                pick = cand[:k]
            else:
                pick = sorted(cand, key=lambda i: (-conf[i], i))[:k]
            for i in pick:
                cells[i] = tok[i]
                masked[i] = False
            step += 1
            steps_total += 1
        timed(
            "commit",
            input_ids=torch.tensor([cells], device=dev),
            attention_mask=full,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        )
        forwards += 1
        output.extend(cells[i] for i in range(B) if P <= start + i < P + N)
    return output, forwards, steps_total


@torch.no_grad()
def decode_static(fn, model, mask_id, prompt, args, dev, events):
    """decode() over scripts/torch_static.py's StaticDecoder (fn: it, or it compiled)."""
    B, S, N = args.block, args.steps, args.max_new_tokens
    P = len(prompt)
    first_block = P // B
    end_blocks = (P + N + B - 1) // B
    forwards = steps_total = 0

    def timed(kind, cells, start):
        ids = torch.tensor(cells, device=dev)
        st = torch.tensor(start, device=dev)
        if dev.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn(ids, st).clone()
            b.record()
            events.append((kind, a, b))
        else:
            t0 = time.perf_counter()
            out = fn(ids, st).clone()
            events.append((kind, t0, time.perf_counter()))
        return out

    for b in range(first_block):  # whole prompt blocks, one block pass each (one graph shape)
        timed("prefill", prompt[b * B:(b + 1) * B], b * B)
        forwards += 1
    output = []
    for blk in range(first_block, end_blocks):
        start = blk * B
        cells = [prompt[p] if p < P else mask_id for p in range(start, start + B)]
        masked = [start + i >= P for i in range(B)]
        step = 0
        while any(masked):
            z = timed("denoise", cells, start)
            forwards += 1
            z[:, mask_id] = float("-inf")
            p = torch.softmax(z, dim=-1)
            conf, tok = p.max(dim=-1)
            conf, tok = conf.tolist(), tok.tolist()
            cand = [i for i in range(B) if masked[i]]
            k = min(max(1, scheduled(step, B, S)), len(cand))
            pick = cand[:k] if args.strategy == "sequential" else sorted(cand, key=lambda i: (-conf[i], i))[:k]
            for i in pick:
                cells[i] = tok[i]
                masked[i] = False
            step += 1
            steps_total += 1
        timed("commit", cells, start)
        forwards += 1
        output.extend(cells[i] for i in range(B) if P <= start + i < P + N)
    return output, forwards, steps_total


def make_static(args, dev, dtype):
    import torch_static as ts

    spec = MOE_SHAPES.get(args.shape) or SHAPES[args.shape]
    shape = ts.Shape(*spec)
    capacity = -(-(args.prompt_len + args.max_new_tokens) // args.block) * args.block
    model = ts.StaticDecoder(shape, capacity, args.block, dev, dtype)
    fn = model
    if args.compile:
        fn = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    return model, fn, shape.mask_id, shape.vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="sdar-1.7b", choices=sorted(SHAPES) + sorted(MOE_SHAPES))
    ap.add_argument("--compile", action="store_true",
                    help="scripts/torch_static.py's static-cache decoder under torch.compile(mode='reduce-overhead')")
    ap.add_argument("--static", action="store_true", help="the same static-cache decoder, eager")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--strategy", default="low_confidence_static", choices=["low_confidence_static", "sequential"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads on the CPU (default: torch's, every core)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    dev = args.device
    t0 = time.perf_counter()
    static = args.compile or args.static or args.shape in MOE_SHAPES
    if static:
        model, fn, mask_id, vocab = make_static(args, dev, dtype)
    else:
        model, mask_id, vocab = make_model(args.shape, dev, dtype, args.attn)
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(1)
    prompt = [int(x) for x in torch.randint(0, vocab, (args.prompt_len,), generator=g) if int(x) != mask_id]
    while len(prompt) < args.prompt_len:
        prompt.append(1)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    runs = []
    for r in range(args.warmup + args.repeat):
        events = []
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        if static:
            out, forwards, steps = decode_static(fn, model, mask_id, prompt, args, dev, events)
        else:
            out, forwards, steps = decode(model, mask_id, prompt, args, dev, dtype, events)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
            times = [(k, a.elapsed_time(b)) for k, a, b in events]
        else:
            times = [(k, (b - a) * 1e3) for k, a, b in events]
        wall = (time.perf_counter() - t) * 1e3
        if r >= args.warmup:
            runs.append({"wall_ms": wall, "tokens": len(out), "forwards": forwards, "steps": steps, "times": times})
    walls = [x["wall_ms"] for x in runs]
    wall = statistics.median(walls)
    tokens, forwards = runs[0]["tokens"], runs[0]["forwards"]
    per = lambda kind: [t for x in runs for k, t in x["times"] if k == kind]
    non_prefill = [t for x in runs for k, t in x["times"] if k != "prefill"]
    res = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if dev.startswith("cuda") else f"{dev} ({torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "dtype": args.dtype,
        "attn": args.attn,
        "impl": "compiled" if args.compile else "static" if static else "transformers",
        "weight_bytes": weight_bytes,
        "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens,
        "block": args.block,
        "steps": args.steps,
        "strategy": args.strategy,
        "load_s": load_s,
        "repeat": args.repeat,
        "tokens": tokens,
        "forwards": forwards,
        "decode_ms": wall,
        "tokens_per_s": tokens / (wall / 1e3),
        "forwards_per_s": forwards / (wall / 1e3),
        "ms_per_forward_median": statistics.median(non_prefill),
        "denoise_ms_median": statistics.median(per("denoise")),
        "commit_ms_median": statistics.median(per("commit")),
        "prefill_ms_median": statistics.median(per("prefill")) if per("prefill") else None,
        # the decode's wall time less its prefill pass(es), over the block passes after them
        "wall_ms_per_forward": statistics.median(
            (x["wall_ms"] - sum(t for k, t in x["times"] if k == "prefill"))
            / max(1, sum(1 for k, _ in x["times"] if k != "prefill")) for x in runs),
    }
    print(
        f"torch reference ({res['impl']}) {args.shape} {args.dtype} {args.attn} on {res['device']}: "
        f"{res['tokens_per_s']:.1f} tok/s, {res['forwards_per_s']:.1f} forwards/s, "
        f"{res['ms_per_forward_median']:.2f} ms/forward ({'CUDA events' if dev.startswith('cuda') else 'wall per forward'}, median: "
        f"denoise {res['denoise_ms_median']:.2f}, commit {res['commit_ms_median']:.2f}, prefill {res['prefill_ms_median'] or 0:.2f}), "
        f"{res['wall_ms_per_forward']:.2f} ms/forward (wall), {tokens} tokens in {forwards} forwards"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
