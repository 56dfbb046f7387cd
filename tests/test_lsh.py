"""Reformer LSH attention against full shared-QK attention (numpy), and its approach to it with more rounds; each
convention option against a numpy reference written from trax's and HF's code, and "unit" + "across_rounds" against
HF's layer itself (tests/fixtures/reformer_lsh.npz); per-step rotations: reproducible, and exact under the
reversible backward pass."""

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_gradients
from conftest import compiled
from conftest import mixer_config
from efftx import model as model_lib
from efftx import reversible
from efftx import trainer
from efftx.mixers import MIXERS

H = 2


def _full_shared_qk_attention(x, mask, params, causal, scale="sqrt_d"):
  """Softmax attention with K = normalised Q; a position attends to itself only when nothing else is allowed.
  Logits q·k̂/√K (scale "sqrt_d") or q·k̂ (scale "unit")."""
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
        s = np.array([q[b, i, h] @ k[b, j, h] for j in keys]) / (np.sqrt(K) if scale == "sqrt_d" else 1)
        p = np.exp(s - s.max())
        out[b, i, h] = (p / p.sum()) @ v[b, keys, h]
  return np.einsum("blhk,hkd->bld", out, params["out"]["kernel"]) + params["out"]["bias"]


def _inputs(L=9, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, L, 8)).astype(np.float32)
  mask = np.ones((2, L), bool)
  mask[1, L - 3 :] = False
  return x, mask


@pytest.mark.parametrize("causal,hashes", [(False, 3), (True, 1)])
def test_one_bucket_one_chunk_is_full_shared_qk_attention(causal, hashes):
  """Causal with several rounds (and buckets): test_one_chunk_is_full_attention_in_every_convention."""
  x, mask = _inputs()
  module = MIXERS["lsh"](num_heads=H, causal=causal, lsh_buckets=1, lsh_hashes=hashes, lsh_chunk=64)
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  want = _full_shared_qk_attention(x.astype(np.float64), mask, params, causal)
  np.testing.assert_allclose(
    np.asarray(compiled(module).apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-4, atol=1e-5
  )


def test_more_hash_rounds_approach_full_attention():
  """Over four draws of the rotations (N(0, 1), as the module draws them from lsh_seed; passed in, so that the
  draws share one compiled program per number of rounds), 8 rounds are closer to full attention than 1."""
  L = 64
  x, mask = _inputs(L)
  full = MIXERS["lsh"](num_heads=H, lsh_buckets=1, lsh_chunk=L)
  variables = compiled(full).init(jax.random.key(0), x)
  reference = np.asarray(compiled(full).apply(variables, x, mask=mask))[mask]
  errors = {}
  for hashes in (1, 8):
    module = MIXERS["lsh"](num_heads=H, lsh_buckets=8, lsh_hashes=hashes, lsh_chunk=8)
    draws = [np.random.default_rng(seed).normal(size=(H, hashes, 8 // H, 4)).astype(np.float32) for seed in range(4)]
    outputs = [compiled(module).apply(variables, x, mask=mask, rotations_HxRxKxN=r) for r in draws]
    errors[hashes] = np.mean([np.abs(np.asarray(y)[mask] - reference).mean() for y in outputs])
  assert errors[8] < 0.7 * errors[1], errors


def test_forward_is_reproducible_and_seeded():
  x, mask = _inputs(32)
  make = lambda seed: MIXERS["lsh"](num_heads=H, lsh_buckets=4, lsh_chunk=4, lsh_seed=seed)
  variables = compiled(make(0)).init(jax.random.key(0), x)
  a, b = (np.asarray(compiled(make(0)).apply(variables, x, mask=mask)) for _ in range(2))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, np.asarray(compiled(make(1)).apply(variables, x, mask=mask)))


def test_bad_bucket_count_is_refused():
  with pytest.raises(ValueError, match="lsh_buckets"):
    MIXERS["lsh"](lsh_buckets=3)


# ------------------------------------------------------------------ conventions (trax / HF) against numpy


def _lsh_reference(x, mask, params, rotations_HxRxKxN, chunk, causal, scale, lookback):
  """LSH attention as trax's `LSHSelfAttention.forward_unbatched` + `attend` and HF's `LSHSelfAttention` compute it,
  one example and head at a time, in float64. Rounds hash q with the given rotations (as trax and HF do),
  buckets = argmax([qR; −qR]), padding in bucket n_buckets; each round's positions sorted by (bucket, position).
  "per_round": each round's sorted sequence is chunked on its own; "across_rounds": the rounds' sorted sequences one
  after another, chunked (HF/trax). A chunk sees itself and the chunk before it, cyclically (only itself if it is the
  only one). Logits: a copy of the query's own position −1e5 (HF); padded keys and (causal) later positions excluded;
  others q·k̂/√K with k̂ = q/‖q‖ ("sqrt_d") or q·k̂ with k̂ = q / sqrt(mean(q²) + 1e-6) / √K ("unit", trax
  `length_normalized`, HF `_len_and_dim_norm`). Each round's softmax output and logsumexp; rounds weighted by the
  softmax of their logsumexps. The sequence is padded to whole chunks with masked positions (efftx's extension;
  trax and HF need a multiple of the chunk)."""
  B, L, D = x.shape
  H, R, K, half = rotations_HxRxKxN.shape
  P = -(-L // chunk) * chunk
  qv = np.einsum("bld,dchk->blchk", x, params["qkv"]["kernel"]) + params["qkv"]["bias"]
  out = np.zeros((B, L, H, K))
  for b, h in itertools.product(range(B), range(H)):
    real = np.concatenate([mask[b], np.zeros(P - L, bool)])
    q, v = (np.concatenate([qv[b, :, c, h], np.zeros((P - L, K))]) for c in (0, 1))
    if scale == "unit":
      k, factor = q / np.sqrt(np.mean(q**2, -1, keepdims=True) + 1e-6) / np.sqrt(K), 1.0
    else:
      k, factor = q / np.linalg.norm(q, axis=-1, keepdims=True).clip(1e-30), 1 / np.sqrt(K)
    rounds = []
    for r in range(R):
      xr = q @ rotations_HxRxKxN[h, r]
      bucket = np.where(real, np.argmax(np.concatenate([xr, -xr], -1), -1), 2 * half)
      rounds.append([(r, i) for i in sorted(range(P), key=lambda i: (bucket[i], i))])
    sequences = rounds if lookback == "per_round" else [sum(rounds, [])]
    o_RxPxK, lse_RxP = np.zeros((R, P, K)), np.zeros((R, P))
    for sequence in sequences:
      chunks = [sequence[c : c + chunk] for c in range(0, len(sequence), chunk)]
      for c, own in enumerate(chunks):
        window = [j for _, j in own + (chunks[c - 1] if len(chunks) > 1 else [])]
        for r, i in own:
          s = np.array(
            [-1e5 if j == i else -np.inf if not real[j] or (causal and j > i) else q[i] @ k[j] * factor for j in window]
          )
          lse_RxP[r, i] = s.max() + np.log(np.exp(s - s.max()).sum())
          o_RxPxK[r, i] = np.exp(s - lse_RxP[r, i]) @ v[window]
    weights_RxP = np.exp(lse_RxP - lse_RxP.max(0))
    out[b, :, h] = np.einsum("rpk,rp->pk", o_RxPxK, weights_RxP / weights_RxP.sum(0))[:L]
  return np.einsum("blhk,hkd->bld", out, params["out"]["kernel"]) + params["out"]["bias"]


@pytest.mark.parametrize("lookback", ["per_round", "across_rounds"])
@pytest.mark.parametrize("scale", ["sqrt_d", "unit"])
@pytest.mark.parametrize("causal", [False, True])
def test_conventions_match_numpy_reference(causal, scale, lookback):
  x, mask = _inputs(L=14)  # 14 = 3 chunks of 4 + 2: the last chunk is padded
  rotations = np.random.default_rng(3).normal(size=(H, 3, 8 // H, 2)).astype(np.float32)
  module = MIXERS["lsh"](
    num_heads=H, causal=causal, lsh_buckets=4, lsh_hashes=3, lsh_chunk=4, lsh_scale=scale, lsh_lookback=lookback
  )
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  want = _lsh_reference(x.astype(np.float64), mask, params, rotations.astype(np.float64), 4, causal, scale, lookback)
  got = np.asarray(compiled(module).apply(variables, x, mask=mask, rotations_HxRxKxN=rotations))
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lookback", ["per_round", "across_rounds"])
@pytest.mark.parametrize("scale", ["sqrt_d", "unit"])
def test_one_chunk_is_full_attention_in_every_convention(scale, lookback):
  """HF computes full attention when the sequence fits in one chunk; the chunks compute the same here (across
  rounds every key is met once per round in each window, which leaves the softmax unchanged)."""
  x, mask = _inputs()
  module = MIXERS["lsh"](
    num_heads=H, causal=True, lsh_buckets=4, lsh_hashes=3, lsh_chunk=64, lsh_scale=scale, lsh_lookback=lookback
  )
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  want = _full_shared_qk_attention(x.astype(np.float64), mask, params, True, scale)
  np.testing.assert_allclose(
    np.asarray(compiled(module).apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-4, atol=1e-5
  )


# ------------------------------------------------------------------ parity with HF transformers' LSHSelfAttention

_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "reformer_lsh.npz")


@pytest.mark.parametrize("causal", [False, True])
def test_unit_across_rounds_equals_hf_reformer_lsh(causal):
  """HF's layer (tests/fixtures/make_reformer_lsh_fixture.py: 2 heads of 8, 4 buckets, 2 hashes, chunk 4, length 16,
  one example padded) with its weights and rotations mapped in: the same output to float32 rounding."""
  f = np.load(_FIXTURE)
  (_, _, D), (_, K, R, half) = f["x"].shape, f["rotations_HxKxRxN"].shape
  heads = lambda w_HKxD: w_HKxD.T.reshape(D, H, K)  # torch Linear (out, in) → D×H×K; HF splits out as (H, K)
  params = {
    "qkv": {
      "kernel": np.stack([heads(f["query_key"]), heads(f["value"])], 1),  # shared QK, V; no biases
      "bias": np.zeros((2, H, K), np.float32),
    },
    "out": {"kernel": f["out"].T.reshape(H, K, D), "bias": np.zeros(D, np.float32)},
  }
  rotations_HxRxKxN = f["rotations_HxKxRxN"].transpose(0, 2, 1, 3)
  want = f["out_decoder" if causal else "out_encoder"]  # HF in float64 (see the fixture script)
  mask = f["mask"]

  # The numpy reference is HF's computation ...
  reference = _lsh_reference(
    f["x"].astype(np.float64),
    mask,
    jax.tree.map(np.float64, params),
    rotations_HxRxKxN.astype(np.float64),
    int(f["chunk"]),
    causal,
    "unit",
    "across_rounds",
  )
  np.testing.assert_allclose(reference[mask], want[mask], rtol=0, atol=1e-9)
  # ... and so is efftx's module.
  module = MIXERS["lsh"](
    num_heads=H,
    causal=causal,
    lsh_buckets=2 * half,
    lsh_hashes=R,
    lsh_chunk=int(f["chunk"]),
    lsh_scale="unit",
    lsh_lookback="across_rounds",
  )
  got = np.asarray(compiled(module).apply({"params": params}, f["x"], mask=mask, rotations_HxRxKxN=rotations_HxRxKxN))
  assert np.abs(got - want)[mask].max() < 1e-5, np.abs(got - want)[mask].max()  # measured: 8e-8, 1.1e-7


# ------------------------------------------------------------------ rotations drawn every training step


def _per_step(**options):
  return MIXERS["lsh"](num_heads=H, lsh_buckets=4, lsh_chunk=4, lsh_rotations="per_step", **options)


def test_per_step_rotations_follow_the_dropout_key_and_are_fixed_at_evaluation():
  x, mask = _inputs(32)
  module = _per_step()
  variables = compiled(module).init(jax.random.key(0), x)
  run = lambda key, deterministic: np.asarray(
    compiled(module).apply(variables, x, mask=mask, deterministic=deterministic, rngs={"dropout": jax.random.key(key)})
  )
  np.testing.assert_array_equal(run(1, False), run(1, False))  # reproducible
  assert not np.allclose(run(1, False)[mask], run(2, False)[mask])  # another step, other hashes
  np.testing.assert_array_equal(run(1, True), run(2, True))  # evaluation: the fixed rotations ...
  fixed = MIXERS["lsh"](num_heads=H, lsh_buckets=4, lsh_chunk=4)
  np.testing.assert_array_equal(run(1, True), np.asarray(compiled(fixed).apply(variables, x, mask=mask)))  # of lsh_seed
  assert not np.allclose(run(1, False)[mask], run(1, True)[mask])


def test_per_step_rotations_and_attention_dropout_draw_different_keys(monkeypatch):
  """The keys jax.random.normal (the rotations) and jax.random.bernoulli (the dropout) are called with, recorded
  while the training pass is traced and returned from the jitted program: one each, and different."""
  x, mask = _inputs(32)
  module = _per_step(attention_dropout=0.5)
  variables = compiled(module).init(jax.random.key(0), x)
  keys = {"normal": [], "bernoulli": []}
  for name in keys:
    draw = getattr(jax.random, name)

    def recording(key, *args, draw=draw, name=name, **kwargs):
      keys[name].append(jax.random.key_data(key))
      return draw(key, *args, **kwargs)

    monkeypatch.setattr(jax.random, name, recording)

  def forward(variables, x):
    module.apply(variables, x, mask=mask, deterministic=False, rngs={"dropout": jax.random.key(1)})
    return keys

  drawn = jax.jit(forward)(variables, x)  # a fresh jit: the patched functions are called while it traces
  assert len(drawn["normal"]) == len(drawn["bernoulli"]) == 1, drawn
  assert not np.array_equal(np.asarray(drawn["normal"][0]), np.asarray(drawn["bernoulli"][0]))


def test_reversible_backward_is_exact_with_per_step_rotations():
  """The reversible stack re-runs each layer with its dropout key: the recomputation hashes with the same rotations,
  so its gradients equal plain autodiff's (tests/test_reversible.py checks the other mixers the same way)."""
  B, L, D = 2, 16, 16
  config = mixer_config(
    "lsh",
    num_heads=2,
    causal=True,
    max_len=L,
    d_model=D,
    lsh_buckets=4,
    lsh_chunk=4,
    lsh_rotations="per_step",
    attention_dropout=0.1,
  )
  make_mixer = trainer.parts(config).model.make_mixer
  stack = reversible.ReversibleStack(
    make_f=lambda: model_lib.MixingSublayer(make_mixer, 0.2, parent=None),
    make_g=lambda: model_lib.FeedForwardSublayer(32, 0.2, 0, parent=None),
    num_layers=2,
  )
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(B, L, D)).astype(np.float32))
  mask = jnp.asarray(np.arange(L)[None, :] < np.array([[L], [11]]))
  layers = jax.jit(lambda: stack.init(jax.random.key(0), x, mask, True)["params"]["layers"])()
  f, g = stack._apply_fns(deterministic=False)  # pylint: disable=protected-access
  weights = jnp.asarray(rng.normal(size=(B, L, D)).astype(np.float32))

  def grads(forward):
    def loss(layers, x1, x2, key):
      y1, y2 = forward(f, g, layers, x1, x2, mask, key)
      return ((y1 + 2 * y2) * weights).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

  plain = grads(reversible.coupling_forward)
  got = jax.tree.leaves(grads(reversible.reversible_forward)(layers, x, x, jax.random.key(7)))
  want = jax.tree.leaves(plain(layers, x, x, jax.random.key(7)))
  # Equal up to rounding (as in tests/test_reversible.py): each of the 2 layers reconstructs its inputs and sums its
  # weight gradients over the B·L rows in another program.
  assert_close_gradients(got, want, n_terms=2 * B * L)
  # Another key draws other rotations (and dropout): other gradients.
  assert not np.allclose(jax.tree.leaves(plain(layers, x, x, jax.random.key(8)))[0], want[0])


@pytest.mark.parametrize("option", ["lsh_rotations", "lsh_scale", "lsh_lookback"])
def test_unknown_convention_is_refused(option):
  with pytest.raises(ValueError, match=option):
    MIXERS["lsh"](**{option: "trax"})
