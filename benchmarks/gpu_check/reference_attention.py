"""The best sliding-window attention a GPU offers, in the same pre-norm transformer layer as ours, for comparison.

Every token attends to itself and its ``window - 1`` predecessors (a causal band of width ``window``): what our
sliding-window layer's windows of ``window`` tokens with stride ``window / 2`` give a token at most. Three
implementations, the fastest of which is the reference:

- ``sdpa-band``: ``F.scaled_dot_product_attention`` with a T x T boolean band mask (quadratic in T: SDPA has no
  band argument, so this is what it can do);
- ``flex-window``: FlexAttention (``torch.nn.attention.flex_attention``) with a block mask of the band, compiled on
  a GPU, so blocks outside the band are skipped (linear in T);
- ``flash-window``: FlashAttention's ``flash_attn_func(..., causal=True, window_size=(window - 1, 0))``, half
  precision on a GPU only, when ``flash_attn`` is installed.

B = batch, T = tokens, C = channels, H = heads, d = C / H.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

IMPLEMENTATIONS = ("sdpa-band", "flex-window", "flash-window")


def unavailable(impl: str, device: torch.device, half: bool, backward: bool = True) -> str:
    """'' when ``impl`` can run here (with a backward pass if ``backward``), else why not."""
    if impl == "flex-window" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    if impl == "flex-window" and backward and device.type != "cuda":
        return "FlexAttention has no backward pass on a CPU"
    if impl == "flash-window":
        if importlib.util.find_spec("flash_attn") is None:
            return "flash_attn not installed"
        if device.type != "cuda" or not half:
            return "FlashAttention runs on a GPU in fp16/bf16 only"
    return ""


def band_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """T x T, True where query i may attend key j: j <= i < j + window."""
    i = torch.arange(length, device=device).unsqueeze(1)  # T x 1
    j = torch.arange(length, device=device).unsqueeze(0)  # 1 x T
    return (j <= i) & (i - j < window)


class BandAttentionLayer(nn.Module):
    """Pre-norm layer: x + attention(LN(x)), then + FFN(LN(.)); the attention is one of ``IMPLEMENTATIONS``."""

    def __init__(self, dim: int, heads: int, ffn: int, window: int, impl: str) -> None:
        super().__init__()
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"unknown attention {impl!r}, expected one of {IMPLEMENTATIONS}")
        self.heads, self.window, self.impl = heads, window, impl
        self.attn_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self._masks: dict = {}  # per (T, device): built once, as a model would cache it
        self._flex = None

    def _mask(self, length: int, device: torch.device):
        key = (length, device)
        if key not in self._masks:
            if self.impl == "sdpa-band":
                self._masks[key] = band_mask(length, self.window, device)
            else:
                from torch.nn.attention.flex_attention import create_block_mask

                window = self.window

                def in_band(b, h, q, k):
                    return (k <= q) & (q - k < window)

                self._masks[key] = create_block_mask(in_band, None, None, length, length, device=str(device))
        return self._masks[key]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: B x H x T x d -> B x H x T x d."""
        length = q.size(2)
        if self.impl == "sdpa-band":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask(length, q.device))
        if self.impl == "flex-window":
            if self._flex is None:
                from torch.nn.attention.flex_attention import flex_attention

                # compiled on a GPU (the fused kernel that skips masked blocks); eager on a CPU (tiny sizes only)
                self._flex = torch.compile(flex_attention, dynamic=False) if q.is_cuda else flex_attention
            return self._flex(q, k, v, block_mask=self._mask(length, q.device))
        from flash_attn import flash_attn_func

        # flash_attn takes B x T x H x d; window_size=(left, right) counts keys on each side of the query
        out = flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, window_size=(self.window - 1, 0))
        return out.transpose(1, 2)  # B x H x T x d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: B x T x C -> B x T x C."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)  # B x T x H x d
        mixed = self.attend(*(z.transpose(1, 2) for z in (q, k, v)))  # B x H x T x d
        x = x + self.out(mixed.transpose(1, 2).reshape(b, t, c))  # B x T x C
        return x + self.fc2(F.relu(self.fc1(self.ffn_norm(x))))


def agreement(dim: int, heads: int, ffn: int, window: int, length: int, device: torch.device) -> dict:
    """Largest output difference of each runnable implementation from ``sdpa-band`` with the same weights (forward,
    fp32 inputs; flash in bf16 autocast): the references compute the same layer before their speed is compared."""
    torch.manual_seed(0)
    reference = BandAttentionLayer(dim, heads, ffn, window, "sdpa-band").to(device).eval()
    x = torch.randn(1, length, dim, device=device)  # B x T x C
    result = {}
    with torch.no_grad():
        expected = reference(x)
        for impl in IMPLEMENTATIONS[1:]:
            half = impl == "flash-window"
            why = unavailable(impl, device, half, backward=False)
            if why:
                result[impl] = why
                continue
            other = BandAttentionLayer(dim, heads, ffn, window, impl).to(device).eval()
            other.load_state_dict(reference.state_dict())
            try:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
                    result[impl] = float((other(x).float() - expected).abs().max())
            except Exception as err:  # reported in the table, not raised: the timing cases say more
                result[impl] = f"{type(err).__name__}: {str(err)[:200]}"
    return result
