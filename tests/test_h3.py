"""H3 (efftx/mixers/h3.py) against a float64 numpy port of Zoology's torch code: zoology/mixers/h3/h3.py `H3.forward`
(the path without the fused fftconv) and `H3.step`, with ss_kernel_shift.py `SSKernelShift.forward` and
ss_kernel_diag.py `SSKernelDiag.forward` (bilinear, real_type exp, log_vandermonde_naive). The flax parameters are
copied into the port under the reference's names and layouts (Linear weight out × in; the shift SSM's C and the
diagonal SSM's C with their leading channel axis of 1).

Tolerance: the JAX side computes in float32. An output is a sum over D output weights of products q·(conv + D·kv)
whose convolution sums L terms whose kernels sum N/2 modes, so it lies within (2D + L + N/2 + head_dim)·eps32 of
its size of the float64 port (assert_close_sums); the kernels' phases l·arg(Ā) add at most L·eps relative.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import assert_finite_grads_and_bfloat16_close
from efftx.errors import UserError
from efftx.mixers import MIXERS

D = 8


# ---------------------------------------------------------------------------------------------------------------
# The reference, ported from zoology/mixers/h3/ (float64, torch's layouts, the reference's einops rearranges
# written as reshapes and transposes).


def _shift_kernel(B, C, L):
  """SSKernelShift.forward(L=L): irfft(conj(rfft(B)) · rfft(C)) over 2N, cut to min(N, L), zero-padded to L."""
  N = B.shape[-1]
  B_f = np.fft.rfft(B, n=2 * N)
  C_f = np.fft.rfft(C, n=2 * N)
  k = np.fft.irfft(B_f.conj() * C_f, n=2 * N)[..., : min(N, L)]
  if N < L:
    k = np.pad(k, [(0, 0)] * (k.ndim - 1) + [(0, L - N)])
  return k  # (1, H, L)


def _diag_kernel(sd, L):
  """SSKernelDiag.forward(L=L), disc bilinear, real_type exp: (1, H, L)."""
  dt = np.exp(sd["kernel.kernel.log_dt"])
  C = sd["kernel.kernel.C"][..., 0] + 1j * sd["kernel.kernel.C"][..., 1]  # (1, H, N)
  A = -np.exp(sd["kernel.kernel.inv_A_real"]) + 1j * sd["kernel.kernel.A_imag"]
  B = (sd["kernel.kernel.B"][..., 0] + 1j * sd["kernel.kernel.B"][..., 1])[None]  # (1, H, N)
  dtA = A * dt[:, None]
  C = (B[:, None] * C).reshape(-1, *A.shape)
  C = C * (1.0 - dtA / 2) ** -1 * dt[:, None]
  dA = (1.0 + dtA / 2) / (1.0 - dtA / 2)
  vandermonde = np.exp(np.log(dA)[..., None] * np.arange(L))  # log_vandermonde_naive
  return 2 * np.einsum("...n,...nl->...l", C, vandermonde).real


def _zoology_h3(u, sd, head_dim, l_max, mask=None):
  """H3.forward without inference_params or fftconv. `mask` (efftx's addition, not the reference's): u, k and v
  are zeroed at padded positions."""
  if mask is not None:
    u = np.where(mask[..., None], u, 0.0)
  b, L, d = u.shape
  H = d // head_dim
  L_kernel = L if l_max is None else min(L, l_max)
  ssm_kernel = _diag_kernel(sd, L_kernel)[0]  # '1 h l -> h l'
  q, k, v = (u @ sd[f"{n}.weight"].T + sd[f"{n}.bias"] for n in ("q_proj", "k_proj", "v_proj"))
  if mask is not None:
    k, v = (np.where(mask[..., None], a, 0.0) for a in (k, v))
  q, k, v = (a.transpose(0, 2, 1) for a in (q, k, v))  # b h l
  ssm_k_kernel = _shift_kernel(sd["ssm_k_kernel.kernel.B"], sd["ssm_k_kernel.kernel.C"], L_kernel)[0]
  fft_size = L_kernel + L
  shift_k_out = np.fft.irfft(np.fft.rfft(ssm_k_kernel, n=fft_size) * np.fft.rfft(k, n=fft_size), n=fft_size)[..., :L]
  k = shift_k_out + sd["ssm_k_D"][:, None] * k
  # 'b (h d1) l -> b d1 1 h l' and 'b (h d2) l -> b 1 d2 h l'
  heads = lambda a: a.reshape(b, H, head_dim, L).transpose(0, 2, 1, 3)
  kv = heads(k)[:, :, None] * heads(v)[:, None]  # b d1 d2 h l
  kv_f = np.fft.rfft(kv, n=fft_size) / fft_size
  ssm_kernel_f = np.fft.rfft(ssm_kernel, n=fft_size)
  y = np.fft.irfft(kv_f * ssm_kernel_f, n=fft_size, norm="forward")[..., :L]
  y = y + kv * sd["D"][:, None]
  q = heads(q)[:, :, None]  # b d1 1 h l
  if head_dim > 1:
    y = (y * q).sum(1).reshape(b, head_dim * H, L)  # mul_sum, then 'b d h l -> b (d h) l'
  else:
    y = (y * q).reshape(b, H, L)
  y = y.transpose(0, 2, 1)
  return y @ sd["output_linear.weight"].T + sd["output_linear.bias"]


def _state_dict(params):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  sd = {}
  for name in ("q_proj", "k_proj", "v_proj", "output_linear"):
    sd[f"{name}.weight"], sd[f"{name}.bias"] = p[name]["kernel"].T, p[name]["bias"]
  sd["ssm_k_kernel.kernel.B"] = p["ssm_k_kernel"]["B"]
  sd["ssm_k_kernel.kernel.C"] = p["ssm_k_kernel"]["C"][None]  # (channels, H, N)
  sd["ssm_k_D"], sd["D"] = p["ssm_k_D"], p["D"]
  diag = p["ssm_kernel"]
  sd["kernel.kernel.C"] = diag["C"][None]  # (channels, H, N, 2)
  for name in ("B", "log_dt", "inv_A_real", "A_imag"):
    sd[f"kernel.kernel.{name}"] = diag[name]
  return sd


# ---------------------------------------------------------------------------------------------------------------


def _params(module, x, seed=1):
  """Parameters of the module's shapes (jax.eval_shape: nothing compiled) drawn in numpy from the reference's initial
  distributions, with the biases (0 at first), the SSMs' B (constants at first) and A moved off their starting
  values, as training moves them, so that the comparison sees every parameter."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(module.init, jax.random.key(0), x)["params"]

  def draw(path, leaf):
    name, shape = "/".join(k.key for k in path), leaf.shape
    if path[-1].key == "kernel":  # q_proj, k_proj, v_proj, output_linear
      return rng.normal(size=shape) / math.sqrt(shape[0])
    moved = 0.3 * rng.normal(size=shape)
    return {
      "ssm_k_kernel/B": lambda: np.eye(shape[1])[[0] * shape[0]] + moved,
      "ssm_k_kernel/C": lambda: rng.uniform(-1, 1, size=shape) / math.sqrt(shape[1]),
      "ssm_kernel/log_dt": lambda: rng.uniform(math.log(1e-3), math.log(1e-1), size=shape),
      "ssm_kernel/inv_A_real": lambda: math.log(0.5) + moved,
      "ssm_kernel/A_imag": lambda: math.pi * np.arange(shape[1]) + moved,
      "ssm_kernel/B": lambda: np.stack([np.ones(shape[:2]), np.zeros(shape[:2])], -1) + moved,
      "ssm_kernel/C": lambda: math.sqrt(0.5) * rng.normal(size=shape),
    }.get(name, lambda: rng.normal(size=shape))()  # biases, D, D_k

  return jax.tree.map(np.float32, jax.tree_util.tree_map_with_path(draw, shapes))


def _apply(module, params, xs, mask=None):
  """The module's outputs on each of xs, in one jitted program."""
  return jax.jit(lambda p, xs, mask: [module.apply({"params": p}, x, mask=mask) for x in xs])(params, xs, mask)


def _assert_initialised_as_the_reference(p, N, dt_min=0.001, dt_max=0.1):
  """SSKernel's defaults: log Δ uniform in [log dt_min, log dt_max], A = −1/2 + iπn (diag-lin), B = 1, C complex
  N(0, 1) (variance 1/2 per part); the shift SSM's B = e₁ and C ~ U(±1/√N) (Conv1d's init). With N ≥ 64 (hundreds
  of draws) the spread of the draws too."""
  diag, shift = p["ssm_kernel"], p["ssm_k_kernel"]
  H, M = diag["A_imag"].shape
  assert M == N // 2 and np.all(np.exp(diag["log_dt"]) >= dt_min * (1 - 1e-6))
  assert np.all(np.exp(diag["log_dt"]) <= dt_max * (1 + 1e-6))
  np.testing.assert_allclose(np.exp(diag["inv_A_real"]), np.full((H, M), 0.5), rtol=1e-6)
  np.testing.assert_allclose(diag["A_imag"], np.broadcast_to(math.pi * np.arange(M), (H, M)), rtol=1e-6)
  np.testing.assert_array_equal(diag["B"], np.stack([np.ones((H, M)), np.zeros((H, M))], -1))
  np.testing.assert_array_equal(shift["B"], np.eye(N)[[0] * shift["B"].shape[0]])
  assert np.abs(shift["C"]).max() <= 1 / math.sqrt(N)
  if N >= 64:
    assert abs(np.var(diag["C"]) - 0.5) < 0.1
    assert np.abs(shift["C"]).max() > 0.9 / math.sqrt(N) and abs(np.abs(shift["C"]).mean() * 2 * math.sqrt(N) - 1) < 0.1


def _n_terms(L, d_state, head_dim):
  return 2 * D + L + d_state // 2 + head_dim


# (head_dim, d_state, L, max_len): the reference's defaults (head_dim 1, d_state 64); one position with Figure 2's
# head_dim 2 and d_state = l_max (d_state 0 here); a length over max_len (kernels of max_len taps, the shift SSM's 5
# taps zero-padded) and an odd d_state (the diagonal SSM has its floor(N/2) modes). Figure 2's setting at a length
# that is no power of two: the padding test below.
@pytest.mark.parametrize("head_dim,d_state,L,max_len", [(1, 64, 11, 16), (2, 0, 1, 2), (4, 5, 9, 6)])
def test_h3_equals_zoology(head_dim, d_state, L, max_len):
  x = np.random.default_rng(0).normal(size=(2, L, D)).astype(np.float32)
  module = MIXERS["h3"](causal=True, head_dim=head_dim, d_state=d_state, max_len=max_len)
  params = _params(module, x)
  (y,) = _apply(module, params, [x])
  want = _zoology_h3(x.astype(np.float64), _state_dict(params), head_dim, max_len)
  assert_close_sums(y, want, n_terms=_n_terms(L, d_state or max_len, head_dim))


def test_padding_at_both_ends_reaches_no_real_position():
  """Figure 2's setting (head_dim 2, d_state = l_max = L). Real positions 2 … 7 of 11: their outputs are the
  port's with u, k and v zero at the padding (k and v carry their projections' biases there otherwise), and do not
  change when the padding holds anything else."""
  L = 11
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, L, D)).astype(np.float32)
  mask = np.zeros((2, L), bool)
  mask[:, 2:8] = True
  noisy = np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32)
  module = MIXERS["h3"](causal=True, head_dim=2, d_state=0, max_len=L)
  params = _params(module, x)
  y, y_noisy = _apply(module, params, [x, noisy], mask)
  want = _zoology_h3(x.astype(np.float64), _state_dict(params), 2, L, mask=mask)
  assert_close_sums(np.asarray(y)[mask], want[mask], n_terms=_n_terms(L, L, 2))
  # The same sums of the same numbers, but in another fusion of the program: within their rounding.
  assert_close_sums(np.asarray(y)[mask], np.asarray(y_noisy)[mask], n_terms=_n_terms(L, L, 2))


def test_decoding_runs_the_references_recurrences():
  """Figure 2's setting (head_dim 2, d_state = L): one position at a time through the shift register and the
  diagonal SSM's states (the reference's H3.step) equals the forward pass (the registry's decoding test covers
  head_dim 1)."""
  L = 7
  x = np.random.default_rng(5).normal(size=(2, L, D)).astype(np.float32)
  module = MIXERS["h3"](causal=True, head_dim=2, d_state=0, max_len=L)

  cache_shapes = jax.eval_shape(lambda x: module.init(jax.random.key(0), x, decode=True)["cache"], x)

  @jax.jit
  def run(params, x):
    def step(cache, x_t):
      y_t, mutated = module.apply({"params": params, "cache": cache}, x_t[:, None], decode=True, mutable=["cache"])
      return mutated["cache"], y_t[:, 0]

    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
    _, ys = jax.lax.scan(step, cache, x.swapaxes(0, 1))
    return module.apply({"params": params}, x), ys.swapaxes(0, 1)

  full, stepped = run(_params(module, x), x)
  assert_close_sums(stepped, full, n_terms=_n_terms(L, L, 2))


def test_gradients_are_finite_and_bfloat16_follows_float32():
  L = 11
  x = np.random.default_rng(4).normal(size=(2, L, D)).astype(np.float32)
  module = MIXERS["h3"](causal=True, head_dim=2, d_state=0, max_len=L)

  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


def test_initialisation_is_the_references():
  """The SSMs' parameters as SSKernel makes them (dt_min and dt_max set: the options reach Δ's range)."""
  module = MIXERS["h3"](causal=True, d_state=64, dt_min=0.01, dt_max=0.2)
  params = jax.jit(module.lazy_init)(jax.random.key(0), np.zeros((1, 3, D), np.float32))["params"]
  _assert_initialised_as_the_reference(params, 64, dt_min=0.01, dt_max=0.2)
  assert np.all(params["ssm_k_D"] != 0) and np.all(params["D"] != 0)  # N(0, 1)


def test_options_are_checked():
  with pytest.raises(UserError, match="head_dim"):
    MIXERS["h3"].check({"head_dim": 3}, d_model=8, causal=True)
  with pytest.raises(UserError, match="d_state ≥ 2"):
    MIXERS["h3"].check({"d_state": 1}, d_model=8, causal=True)
  with pytest.raises(UserError, match="causal only"):
    MIXERS["h3"](causal=False)
  with pytest.raises(UserError, match="has no SSM mode"):
    MIXERS["h3"](causal=True, d_state=0, max_len=1).init(jax.random.key(0), np.zeros((1, 1, D), np.float32))
