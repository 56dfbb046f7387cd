"""RetNet's retention (efftx/mixers/retnet.py) against a float64 port of fla's layer, written from the reference
(fla-org/flash-linear-attention): fla/layers/multiscale_retention.py `MultiScaleRetention.forward` at its defaults
(expand_k 1, expand_v 2, no short conv, no feature map, use_output_gate with gate_fn swish and fuse_norm:
FusedRMSNormGated per head), fla/modules/rotary.py (`RotaryEmbedding(dim=head_k_dim)`, base 10,000, inv_freq =
base^(−arange(0, K, 2)/K), `rotary_embedding_ref` not interleaved: x cos + rotate_half(x) sin with cos, sin
repeated over the two halves) and the retention of fla/ops/retention/naive.py `naive_retention` (the parallel
form: Σ_{s≤t} 2^{(t−s) log2(1 − 2^(−5−h))} q_t·k_s K^−½ v_s). Our parameters are copied in under the reference's
names (Linear weight out × in); fla unpads, so each sequence's real positions alone go through the port, at
rotary positions 0, 1, ….

Tolerance: float32 against float64, the chain's roundings added (assert_close_sums): projections (D terms), the
rotary angles (position·eps relative: L), the retention's sums (L + chunk + K), the norm (V), the output
projection (H·V).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import assert_finite_grads_and_bfloat16_close
from conftest import compiled
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L, D, H = 2, 13, 8, 2
K, V, CHUNK = D // H, 2 * D // H, 5
N_TERMS = D + L + (L + CHUNK + K) + V + H * V


def _naive_retention(q, k, v, xp=np):
  """naive_retention on heads-first q, k (H×L×K), v (H×L×V)."""
  n_heads, seq_len, d_head = q.shape
  s = xp.log2(1 - 2.0 ** (-5.0 - xp.arange(n_heads)))
  n = xp.arange(seq_len)
  decay = xp.exp2((n[:, None] - n[None, :]) * s[:, None, None]) * (n[:, None] >= n[None, :])
  scores = xp.einsum("hqd,hkd,hqk->hqk", q * d_head**-0.5, k, decay)
  return xp.einsum("hqk,hkd->hqd", scores, v)


def _recurrent_retention(q, k, v, xp=np):
  """The recurrent form of the same retention (RetNet paper, eq. 6: S_t = γ S_{t−1} + k_tᵀ v_t, o_t = q_t S_t with
  q scaled by K^−½), a step at a time in float64: linear in the length, for long sequences. numpy only."""
  assert xp is np, "the recurrent form assigns in place: numpy only"
  n_heads, seq_len, d_head = q.shape
  gamma = 1 - 2.0 ** (-5.0 - np.arange(n_heads))
  S = np.zeros((n_heads, d_head, v.shape[-1]))
  out = np.zeros((n_heads, seq_len, v.shape[-1]))
  for t in range(seq_len):
    S = gamma[:, None, None] * S + k[:, t, :, None] * v[:, t, None, :]
    out[:, t] = np.einsum("hk,hkv->hv", q[:, t] * d_head**-0.5, S)
  return out


def _rotary(x, xp=np):
  """RotaryEmbedding.forward at seqlen_offset 0 on x (L×H×K): rotary_embedding_ref, not interleaved."""
  seq_len, _, dim = x.shape
  inv_freq = 1.0 / 10000.0 ** (xp.arange(0, dim, 2) / dim)
  freqs = xp.outer(xp.arange(seq_len), inv_freq)
  cos = xp.concatenate([xp.cos(freqs)] * 2, -1)[:, None]  # '... d -> ... 1 (2 d)'
  sin = xp.concatenate([xp.sin(freqs)] * 2, -1)[:, None]
  x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
  return x * cos + xp.concatenate([-x2, x1], -1) * sin


def _reference_layer(x, params, heads, xp=np, eps=1e-5, retention=_naive_retention):
  """MultiScaleRetention.forward on one unpadded sequence x (L×D), float64, with `heads` heads."""
  H, K, V = heads, params["q_proj"]["kernel"].shape[1] // heads, params["v_proj"]["kernel"].shape[1] // heads
  linear = lambda name, a: a @ xp.asarray(params[name]["kernel"], xp.float64)
  q = _rotary(linear("q_proj", x).reshape(len(x), H, K), xp)
  k = _rotary(linear("k_proj", x).reshape(len(x), H, K), xp)
  v = linear("v_proj", x).reshape(len(x), H, V)
  o = retention(*(a.transpose(1, 0, 2) for a in (q, k, v)), xp=xp).transpose(1, 0, 2)
  g = linear("g_proj", x).reshape(len(x), H, V)
  rstd = 1 / xp.sqrt((o * o).mean(-1, keepdims=True) + eps)
  o = o * rstd * xp.asarray(params["norm_scale"], xp.float64) * g / (1 + xp.exp(-g))
  return linear("o_proj", o.reshape(len(x), H * V))


def _padded_inputs(seed=0, length=L, left=3, right=2, width=D):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, length, width)).astype(np.float32)
  mask = np.ones((B, length), bool)
  mask[0, :left] = False
  mask[1, length - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


def _module(**options):
  return MIXERS["retnet"](causal=True, **{"num_heads": H, "chunk": CHUNK, **options})


def _params(module, x, seed=1):
  params = jax.tree.map(np.asarray, compiled(module).init(jax.random.key(seed), x)["params"])
  params["norm_scale"] = 1 + 0.3 * np.random.default_rng(seed).normal(size=params["norm_scale"].shape)
  return jax.tree.map(lambda a: np.asarray(a, np.float32), params)


def _compare(module, params, x, mask, n_terms=N_TERMS, retention=_naive_retention):
  y = np.asarray(compiled(module).apply({"params": params}, x, mask=mask))
  for b in range(len(x)):
    want = _reference_layer(np.asarray(x[b][mask[b]], np.float64), params, module.num_heads, retention=retention)
    assert_close_sums(y[b][mask[b]], want, n_terms=n_terms, err_msg=f"sequence {b}")


@pytest.mark.parametrize("heads,chunk", [(2, 5), (1, 4), (4, 64)], ids=["2-heads-chunk-5", "1-head", "one-chunk"])
def test_matches_fla_layer_with_padding_at_both_ends(heads, chunk):
  """Chunks of 5 and 4 (neither divides 13) and one chunk; 1, 2 and 4 heads (decays 1 − 2^−5 … 1 − 2^−8)."""
  module = _module(num_heads=heads, chunk=chunk)
  x, mask = _padded_inputs()
  K, V = D // heads, 2 * D // heads
  _compare(module, _params(module, x), x, mask, n_terms=D + L + (L + chunk + K) + V + heads * V)


def test_decays_are_retnets():
  """γ_h = 1 − 2^(−5−h): the weak decays of the paper (the state holds ~32 … 2^(4+H) positions)."""
  from efftx.mixers.retnet import log_decays  # pylint: disable=g-import-not-at-top

  np.testing.assert_allclose(np.exp(log_decays(4)), 1 - 2.0 ** -np.arange(5, 9), rtol=1e-7)


def test_gradients_equal_the_float64_layers():
  """d Σ y·w / d (every parameter, x) against jax.grad of the reference layer in float64 (jax.numpy under
  enable_x64), padding at both ends; padded inputs get exactly 0."""
  module = _module()
  x, mask = _padded_inputs(seed=2)
  params = _params(module, x, seed=3)
  w = np.random.default_rng(4).normal(size=x.shape) * mask[..., None]
  loss = lambda p, x: jnp.sum(module.apply({"params": p}, x, mask=mask) * w)
  got_p, got_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
  with jax.enable_x64(True):

    def loss64(p, x):
      return sum(jnp.sum(_reference_layer(x[b][mask[b]], p, H, xp=jnp) * w[b][mask[b]]) for b in range(B))

    p64, x64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, x))
    want_p, want_x = jax.tree.map(np.asarray, jax.jit(jax.grad(loss64, argnums=(0, 1)))(p64, x64))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got_p), jax.tree.leaves(want_p)):
    assert_close_sums(a, b, n_terms=N_TERMS + B * L, err_msg=jax.tree_util.keystr(path))
  assert_close_sums(got_x, want_x, n_terms=N_TERMS)
  assert np.all(np.asarray(got_x)[~mask] == 0)


def test_a_sequence_of_4096_with_padding_at_both_ends():
  """Length 4,096 (the slowest head's decay 1 − 2^−6 sums ~64 positions; rotary angles up to 4,096 rad), width 4
  in two heads, chunk 64 (64 chunks), padding at both ends; against the recurrent form (the parallel one's L × L
  decays take seconds here; the two forms agree: test_the_references_recurrent_form_is_its_parallel_form)."""
  module = _module(num_heads=2, chunk=64)
  x, mask = _padded_inputs(seed=5, length=4096, left=100, right=57, width=4)
  n_terms = 4 + 4096 + (4096 + 64 + 2) + 4 + 8
  _compare(module, _params(module, x[:, :8]), x, mask, n_terms=n_terms, retention=_recurrent_retention)


def test_the_references_recurrent_form_is_its_parallel_form():
  """The float64 reference's two forms of retention, on random heads-first q, k, v of 4 heads over 40 positions."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(4, 40, n)) for n in (3, 3, 5))
  np.testing.assert_allclose(_recurrent_retention(q, k, v), _naive_retention(q, k, v), rtol=1e-12, atol=1e-12)


def test_bfloat16_and_finite_gradients():
  module = _module()
  x, _ = _padded_inputs(seed=6)
  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


def test_decoding_equals_the_forward_pass_with_a_state_of_constant_size():
  """Token by token with the cache (a sequence padded at the start: rotary positions count real tokens) gives the
  forward pass's outputs; the cache's shapes do not depend on the positions it is made for."""
  module = _module()
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (3, 64)
  ]
  assert shapes[0] == shapes[1] == {"state": (B, H, K, V), "seen": (B,)}
  x, mask = _padded_inputs(seed=7, right=0)
  variables = {"params": _params(module, x)}
  full = np.asarray(compiled(module).apply(variables, x, mask=mask))
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  step = jax.jit(
    lambda c, x_t, m_t: module.apply({**variables, "cache": c}, x_t, mask=m_t, decode=True, mutable=["cache"])
  )
  for t in range(L):
    y_t, mutated = step(cache, x[:, t : t + 1], mask[:, t : t + 1])
    cache = mutated["cache"]
    real = mask[:, t]
    assert_close_sums(np.asarray(y_t)[real, 0], full[real, t], n_terms=N_TERMS, scale=np.abs(full).max())


def test_options_are_checked():
  spec = MIXERS["retnet"]
  assert spec.defaults() == {"num_heads": 4, "expand_v": 2.0, "chunk": 64, "norm_eps": 1e-5}
  assert type(spec(causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="even head dim"):
    spec.check({"num_heads": 4}, 12, True)
  with pytest.raises(UserError, match="expand_v=0.25"):
    spec.check({"num_heads": 4, "expand_v": 0.25}, 8, True)
  spec.check({"num_heads": 4, "expand_v": 1.5}, 16, True)
