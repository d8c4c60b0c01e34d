"""A numpy reference of the native `sample` op (kernels_native/cpu/sample.cpp): Philox4x32-10
(checked against Random123's known answers), the kept set of top-k / top-p / min-p written
from the host Sampler's rules (sort, walk), the filtered softmax, and the op's inverse-CDF draw
over integer weights, so the op's tokens can be predicted token for token."""

from __future__ import annotations

import numpy as np

from surogate import _native

M32 = 0xFFFFFFFF
SAMPLE_STREAM = 0x53414D50  # core/philox.h kSampleStream


# Filter settings the op tests run over (CPU and CUDA alike).
FILTERS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.3, top_p=0.9),
    dict(temperature=0.8, top_k=50, top_p=0.8),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=0.6, top_k=40, top_p=0.95, min_p=0.02),
    dict(temperature=0.9, top_k=5000, top_p=0.99),
    dict(temperature=2.0, top_k=1),
    dict(temperature=1.0, top_p=1e-6),  # only the top token
]


def philox4x32_10(ctr: list[int], key: list[int]) -> list[int]:
    c = list(ctr)
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
    return c


def uniform(seed: int, step: int) -> float:
    """The op's u in [0, 1): 53 bits of Philox((step, 0, SAMP, 0), seed)."""
    r = philox4x32_10([step & M32, 0, SAMPLE_STREAM, 0], [seed & M32, (seed >> 32) & M32])
    return ((r[0] << 21) | (r[1] >> 11)) * 2.0 ** -53


def params(rows: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, step=0) -> np.ndarray:
    """float32 [rows, 8]; each field a scalar or one value per row (seed / step as uint32 bits)."""
    p = np.zeros((rows, 8), np.float32)
    p[:, 0], p[:, 1], p[:, 2], p[:, 3] = temperature, top_k, top_p, min_p
    bits = p.view(np.uint32)
    seed = np.broadcast_to(np.asarray(seed, np.uint64), (rows,))
    bits[:, 4] = (seed & M32).astype(np.uint32)
    bits[:, 5] = (seed >> np.uint64(32)).astype(np.uint32)
    bits[:, 6] = np.broadcast_to(np.asarray(step, np.uint64), (rows,)).astype(np.uint32)
    return p


def order(x: np.ndarray) -> np.ndarray:
    """Ids by logit, larger first, then lower id."""
    return np.lexsort((np.arange(len(x)), -x.astype(np.float64)))


def scaled(x: np.ndarray, temperature: float) -> np.ndarray:
    """e = exp(x / T - max / T) in float32 with the op's two roundings (exp of the rounded value)."""
    x = x.astype(np.float32)
    inv_t = np.float32(1.0) / np.float32(temperature)
    m = np.float32(x.max()) * inv_t
    return np.exp((x * inv_t - m).astype(np.float64)).astype(np.float32)


def weight_shift(V: int) -> int:
    return 62 - int(V).bit_length()


def weights_of(e: np.ndarray, V: int) -> np.ndarray:
    """The op's integer weights: round(e * 2^shift) (core/sample_math.h)."""
    return np.floor(e.astype(np.float64) * 2.0 ** weight_shift(V) + 0.5).astype(np.uint64)


def kept_mask(x: np.ndarray, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, weights: bool = True) -> np.ndarray:
    """Which tokens sampling may draw: top-k first k of the order, top-p the shortest prefix of
    them reaching top_p of their mass (the host Sampler's walk), min-p e >= min_p. weights: the
    mass as the op's integer weights (exactly the op's cut), else float64 probabilities."""
    V = len(x)
    e = scaled(x, temperature)
    w = weights_of(e, V) if weights else e.astype(np.float64)
    o = order(x)
    keep = np.zeros(V, bool)
    k = int(top_k) if 0 < top_k < V else V
    n = k
    if top_p < 1.0:
        if weights:
            kept = int(w[o[:k]].astype(object).sum())
            target = max(float(np.float32(top_p)) * float(kept), 0.5)
            acc, n = 0, 0
            while n < k and float(acc) < target:
                acc += int(w[o[n]])
                n += 1
        else:
            cum = np.cumsum(w[o[:k]])
            n = int(np.searchsorted(cum, float(np.float32(top_p)) * cum[-1])) + 1
    keep[o[:max(n, 1)]] = True
    return keep & (e >= np.float32(min(min_p, 1.0)))


def probs(x: np.ndarray, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered softmax(x / T) in float64: what the draws should follow."""
    keep = kept_mask(x, temperature, top_k, top_p, min_p)
    z = x.astype(np.float64) / temperature
    p = np.exp(z - z.max()) * keep
    return p / p.sum()


def token(x: np.ndarray, seed: int, step: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> int:
    """The op's token: the first kept id (id order) whose running integer weight passes
    floor(u * mass)."""
    if temperature < 1e-5:
        return int(np.argmax(x))
    V = len(x)
    e = scaled(x, temperature)
    w = np.where(kept_mask(x, temperature, top_k, top_p, min_p), weights_of(e, V), np.uint64(0))
    mass = int(w.astype(object).sum())
    point = min(int(uniform(seed, step) * float(mass)), mass - 1)
    cum = np.cumsum(w.astype(object))
    return int(np.argmax(cum > point))


def log_softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def rank(x: np.ndarray, t: int) -> int:
    """1 + the tokens before t in the order (larger logit, or equal with a lower id)."""
    return 1 + int(np.sum((x > x[t]) | ((x == x[t]) & (np.arange(len(x)) < t))))


def pack_mask(allowed: np.ndarray) -> np.ndarray:
    """bool [R, V] -> the op's int32 bitmask [R, ceil(V / 32)]: bit i % 32 of word i / 32 = token i."""
    R, V = allowed.shape
    W = (V + 31) // 32
    bits = np.zeros((R, W * 32), bool)
    bits[:, :V] = allowed
    words = (bits.reshape(R, W, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=2)
    return words.astype(np.uint32).view(np.int32)


def masked(x: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The row the choice sees: -inf where the mask does not allow the token (float32)."""
    return np.where(allowed, x.astype(np.float32), np.float32(-np.inf)).astype(np.float32)


def run(x: np.ndarray, p: np.ndarray, rank: bool = True, device: str = "cpu", mask: np.ndarray | None = None) -> list:
    """The native op on host arrays: [token, logprob, rank or None]; mask: the int32 bitmask input."""
    R = x.shape[0]
    outs = [np.zeros(R, np.int32), np.zeros(R, np.float32), np.zeros(R, np.int32) if rank else None]
    args = [x, p] if mask is None else [x, p, mask]
    if device == "cpu":
        _native.call_op("sample", args, outs, {})
        return outs
    ins = [_native.tensor(np.ascontiguousarray(a)).to(device) for a in args]
    dev = [None if o is None else _native.tensor(o).to(device) for o in outs]
    _native.call_op("sample", ins, dev, {})
    return [None if o is None else o.to("cpu").numpy() for o in dev]
