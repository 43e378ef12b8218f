"""A hand-written SDAR decoder (Qwen3 / Qwen3-MoE) with a static KV cache, for the compiled
PyTorch reference of `scripts/torch_reference.py --compile` (docs/perf.md).

Why hand-written: transformers' DynamicCache grows and is cropped per pass, so its shapes change
every pass and `torch.compile(mode="reduce-overhead")` (CUDA graphs) cannot capture it. Here every
block pass has one shape, as unmask's does (src/model, `PassInput::window`): the B rows write
their K/V into cache slots [start, start + B) and attend over the whole preallocated cache under
an additive mask that hides the slots at and after start + B. A denoising pass leaves its K/V in
the scratch slots; the commit pass rewrites them with the finished block's. So denoising and
commit passes are the same graph, and one capture serves the whole decode.

Weights are random of the named shape (the values do not matter for speed), bf16 on the device.
MoE layers route as Qwen3-MoE does (softmax in f32 over all experts, top-k, renormalised) and
gather the chosen experts' weights per row (static shapes; the gather copies the weights, so this
reads the routed experts about three times: it is a reference, not a floor).
"""

import torch
import torch.nn.functional as F


class Shape:
    def __init__(self, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tied, mask_id,
                 experts=0, top_k=0, moe_inter=0):
        self.hidden, self.layers, self.heads, self.kv_heads, self.head_dim = hidden, layers, heads, kv_heads, head_dim
        self.inter, self.vocab, self.tied, self.mask_id = inter, vocab, tied, mask_id
        self.experts, self.top_k, self.moe_inter = experts, top_k, moe_inter


def rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    # x [B, heads, d]; cos/sin [B, 1, d] (halves duplicated, as Qwen3's rotate_half expects)
    d = x.shape[-1] // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x * cos + rot * sin


class StaticDecoder(torch.nn.Module):
    def __init__(self, s: Shape, capacity, block, device, dtype, seed=0):
        super().__init__()
        self.s, self.capacity, self.block = s, capacity, block
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape, std=0.02):
            return torch.nn.Parameter((torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std)
                                      .to(dtype), requires_grad=False)

        def ones(n):
            return torch.nn.Parameter(torch.ones(n, device=device, dtype=dtype), requires_grad=False)

        h, hd = s.hidden, s.head_dim
        qkv = (s.heads + 2 * s.kv_heads) * hd
        self.embed = w(s.vocab, h)
        self.lm_head = self.embed if s.tied else w(s.vocab, h)
        self.norm = ones(h)
        self.layers = torch.nn.ModuleList()
        for i in range(s.layers):
            m = torch.nn.Module()
            m.input_norm, m.post_norm = ones(h), ones(h)
            m.qkv, m.o = w(qkv, h), w(h, s.heads * hd)
            m.q_norm, m.k_norm = ones(hd), ones(hd)
            if s.experts:
                m.router = w(s.experts, h)
                m.gate_up = w(s.experts, 2 * s.moe_inter, h)
                m.down = w(s.experts, h, s.moe_inter)
            else:
                m.gate_up, m.down = w(2 * s.inter, h), w(h, s.inter)
            self.layers.append(m)
        # K and V of every layer: [layers, 2, kv_heads, capacity, head_dim], written in place
        self.register_buffer("kv", torch.zeros(s.layers, 2, s.kv_heads, capacity, hd, device=device, dtype=dtype))
        inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
        ang = torch.arange(capacity, device=device, dtype=torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().to(dtype))
        self.register_buffer("sin", ang.sin().to(dtype))
        self.register_buffer("slots", torch.arange(capacity, device=device))

    def weight_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def mlp(self, m, x):
        s = self.s
        if not s.experts:
            g, u = (x @ m.gate_up.t()).chunk(2, dim=-1)
            return (F.silu(g) * u) @ m.down.t()
        probs = torch.softmax((x @ m.router.t()).float(), dim=-1)
        wts, idx = torch.topk(probs, s.top_k, dim=-1)  # [B, k]
        wts = (wts / wts.sum(-1, keepdim=True)).to(x.dtype)
        gu = torch.einsum("bh,bkoh->bko", x, m.gate_up[idx])  # [B, k, 2I]
        g, u = gu.chunk(2, dim=-1)
        y = torch.einsum("bki,bkhi->bkh", F.silu(g) * u, m.down[idx])  # [B, k, H]
        return (y * wts[..., None]).sum(1)

    def forward(self, ids, start):
        """ids [B] int64 on the device, start a 0-dim int64 tensor: logits [B, vocab] (f32)."""
        s = self.s
        B, hd = ids.shape[0], s.head_dim
        pos = start + torch.arange(B, device=ids.device)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        visible = self.slots < start + B  # [capacity]
        mask = torch.zeros(B, self.capacity, device=ids.device, dtype=self.kv.dtype)
        mask = mask.masked_fill(~visible[None], float("-inf"))[None]  # [1, B, cap]: block-causal by construction
        x = self.embed[ids]
        for i, m in enumerate(self.layers):
            h = rms(x, m.input_norm)
            q, k, v = (h @ m.qkv.t()).split([s.heads * hd, s.kv_heads * hd, s.kv_heads * hd], dim=-1)
            q = rope(rms(q.view(B, s.heads, hd), m.q_norm), cos, sin)
            k = rope(rms(k.view(B, s.kv_heads, hd), m.k_norm), cos, sin)
            self.kv[i, 0].index_copy_(1, pos, k.transpose(0, 1))
            self.kv[i, 1].index_copy_(1, pos, v.view(B, s.kv_heads, hd).transpose(0, 1))
            a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], self.kv[i, 0][None], self.kv[i, 1][None],
                                               attn_mask=mask[:, None], enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(B, s.heads * hd) @ m.o.t()
            x = x + self.mlp(m, rms(x, m.post_norm))
        return (rms(x, self.norm) @ self.lm_head.t()).float()

    def prefill(self, ids):
        """Whole prompt blocks, one block pass at a time (the compiled graph has one shape)."""
        for b in range(0, len(ids), self.block):
            self(ids[b:b + self.block], torch.tensor(b, device=ids.device))
