"""Reformer LSH attention against full shared-QK attention (numpy), and its approach to it with more rounds."""
import jax
import numpy as np
import pytest

from efftx.mixers import MIXERS

H = 2


def _full_shared_qk_attention(x, mask, params, causal):
  """Softmax attention with K = normalised Q; a position attends to itself only when nothing else is allowed."""
  B, L, D = x.shape
  K = D // H
  qv = np.einsum("bld,dchk->blchk", x, params["qkv"]["kernel"]) + params["qkv"]["bias"]
  q, v = qv[:, :, 0], qv[:, :, 1]
  k = q / np.linalg.norm(q, axis=-1, keepdims=True)
  out = np.zeros((B, L, H, K))
  for b in range(B):
    for h in range(H):
      for i in range(L):
        keys = [j for j in range(L) if mask[b, j] and (j <= i or not causal) and j != i] or [i]
        s = np.array([q[b, i, h] @ k[b, j, h] for j in keys]) / np.sqrt(K)
        p = np.exp(s - s.max())
        out[b, i, h] = (p / p.sum()) @ v[b, keys, h]
  return np.einsum("blhk,hkd->bld", out, params["out"]["kernel"]) + params["out"]["bias"]


def _inputs(L=9, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, L, 8)).astype(np.float32)
  mask = np.ones((2, L), bool)
  mask[1, L - 3:] = False
  return x, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hashes", [1, 3])
def test_one_bucket_one_chunk_is_full_shared_qk_attention(causal, hashes):
  x, mask = _inputs()
  module = MIXERS["lsh"](num_heads=H, causal=causal, lsh_buckets=1, lsh_hashes=hashes, lsh_chunk=64)
  variables = module.init(jax.random.key(0), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  want = _full_shared_qk_attention(x.astype(np.float64), mask, params, causal)
  np.testing.assert_allclose(np.asarray(module.apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-4,
                             atol=1e-5)


def test_more_hash_rounds_approach_full_attention():
  L = 64
  x, mask = _inputs(L)
  full = MIXERS["lsh"](num_heads=H, lsh_buckets=1, lsh_chunk=L)
  variables = full.init(jax.random.key(0), x)
  reference = np.asarray(full.apply(variables, x, mask=mask))[mask]
  errors = {}
  for hashes in (1, 8):
    errors[hashes] = np.mean([
        np.abs(np.asarray(MIXERS["lsh"](num_heads=H, lsh_buckets=8, lsh_hashes=hashes, lsh_chunk=8, lsh_seed=seed)
                          .apply(variables, x, mask=mask))[mask] - reference).mean()
        for seed in range(4)])
  assert errors[8] < 0.7 * errors[1], errors


def test_forward_is_reproducible_and_seeded():
  x, mask = _inputs(32)
  make = lambda seed: MIXERS["lsh"](num_heads=H, lsh_buckets=4, lsh_chunk=4, lsh_seed=seed)
  variables = make(0).init(jax.random.key(0), x)
  a, b = (np.asarray(make(0).apply(variables, x, mask=mask)) for _ in range(2))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, np.asarray(make(1).apply(variables, x, mask=mask)))


def test_bad_bucket_count_is_refused():
  with pytest.raises(ValueError, match="lsh_buckets"):
    MIXERS["lsh"](lsh_buckets=3)
