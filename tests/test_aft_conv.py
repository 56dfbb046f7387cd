"""AFT-conv (efftx/mixers/aft_conv.py): the 2-D form on an image's patch grid against the paper's formula (numpy
float64 loops over the grid), its geometry (translation equivariance, kernel orientation, the 1-D form as a grid
of one row), and finite gradients for every kernel size — a kernel of one entry (std 0) once gave nan.

The paper (Zhai et al., 2021; /work/shared/PAPERS.md): Y_t = σ(Q_t) ⊙ Σ_t' exp(K_t' + w_tt') V_t' / Σ_t' exp(K_t' +
w_tt'), with w_tt' the head's kernel at the offset of t' from t inside the kernel's reach and 0 outside, the kernel
reparameterised w = γ (w − mean w) / std w + β.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import lm_model
from conftest import mixer_config
from efftx.errors import UserError
from efftx.mixers import aft_conv

B, D = 2, 4


# ---------------------------------------------------------------------------------------------------------------
# The reference, written from the paper's formula.


def _kernel(params) -> np.ndarray:
  """The paper's w = γ (w − mean w) / std w + β over each head's entries (1e-5 under std), float64, raw shape."""
  raw = np.asarray(params["kernel"], np.float64)
  flat = raw.reshape(raw.shape[0], -1)
  gamma, beta = np.asarray(params["gamma"], np.float64), np.asarray(params["beta"], np.float64)
  w = gamma * (flat - flat.mean(1, keepdims=True)) / (flat.std(1, keepdims=True) + 1e-5) + beta
  return w.reshape(raw.shape)


def _grid_bias(kernel_HxSxS: np.ndarray, grid, L: int) -> np.ndarray:
  """w[t, t', h] = kernel[h, dr + off, dc + off] for the cell t' = (r + dr, c + dc) of the cell t = (r, c) when both
  indices lie in 0 … s − 1 (off = (s − 1)//2), 0 for every other pair and for the E = L − R·C leading positions."""
  H, S, _ = kernel_HxSxS.shape
  R, C = grid
  E, off = L - R * C, (S - 1) // 2
  w = np.zeros((L, L, H))
  for r in range(R):
    for c in range(C):
      for r2 in range(R):
        for c2 in range(C):
          a, b = r2 - r + off, c2 - c + off
          if 0 <= a < S and 0 <= b < S:
            w[E + r * C + c, E + r2 * C + c2] = kernel_HxSxS[:, a, b]
  return w


def _sequence_bias(kernel_HxS: np.ndarray, L: int) -> np.ndarray:
  """Bidirectional 1-D: w[t, t', h] = kernel[h, t' − t + (s − 1)//2] when that index lies in 0 … s − 1, else 0."""
  H, S = kernel_HxS.shape
  w = np.zeros((L, L, H))
  for t in range(L):
    for t2 in range(L):
      j = t2 - t + (S - 1) // 2
      if 0 <= j < S:
        w[t, t2] = kernel_HxS[:, j]
  return w


def _formula(x, mask, params, w_LxLxH) -> np.ndarray:
  """The paper's Y_t over the real positions t' of each row (float64; each sum's exponents shifted by their
  maximum, which the ratio does not see), then the output projection. Head h owns channels h·D/H … (h+1)·D/H − 1
  and its one key channel."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  dense = lambda a, layer: a @ layer["kernel"] + layer["bias"]
  x = np.asarray(x, np.float64)
  q, k, v = dense(x, p["query"]), dense(x, p["key"]), dense(x, p["value"])
  H = k.shape[-1]
  G = x.shape[-1] // H
  y = np.zeros_like(q)
  for b in range(x.shape[0]):
    real = np.flatnonzero(mask[b])
    for t in range(x.shape[1]):
      for h in range(H):
        logits = k[b, real, h] + w_LxLxH[t, real, h]
        e = np.exp(logits - logits.max())
        channels = slice(h * G, (h + 1) * G)
        y[b, t, channels] = 1 / (1 + np.exp(-q[b, t, channels])) * (e @ v[b, real, channels]) / e.sum()
  return dense(y, p["out"])


# ---------------------------------------------------------------------------------------------------------------
# Inputs and modules.


def _inputs(L: int, padded: int = 3, seed: int = 0):
  """x ~ N(0, 1) (B×L×D) and a mask whose second row ends in `padded` padded positions."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[1, L - padded :] = False
  return x, mask


def _module(grid, kernel_size, num_heads=2, x=None, seed=0, causal=False):
  """The module and its variables, γ and β set away from their zero init so that the kernel matters (γ of both
  signs, |γ| in [0.5, 1.5]: a kernel whose entries span a few units)."""
  module = aft_conv.AFTConv(causal=causal, num_heads=num_heads, kernel_size=kernel_size, grid=grid)
  variables = jax.jit(module.init)(jax.random.key(seed), x)
  rng = np.random.default_rng(seed + 1)
  gamma = rng.uniform(0.5, 1.5, size=(num_heads, 1)) * rng.choice([-1, 1], size=(num_heads, 1))
  beta = rng.normal(size=(num_heads, 1))
  params = {**variables["params"], "gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32)}
  return module, {"params": params}


def _grid_reference(x, mask, variables, grid):
  params = variables["params"]
  return _formula(x, mask, params, _grid_bias(_kernel(params), grid, x.shape[1]))


# The sums' terms: the projections over D, the weighted sums over the L positions (the convolution adds s² more,
# the kernel's e^w − 1 against the global sum), the output projection over D.
def _n_terms(L, S):
  return 2 * D + 2 * L + S * S


# ---------------------------------------------------------------------------------------------------------------
# The 2-D form against the formula.


@pytest.mark.parametrize("kernel_size", [1, 2, 3, 5])
def test_grid_aft_conv_matches_the_formula(kernel_size):
  """On a non-square grid (a transposed layout would show); square grids: test_a_padded_row_sums_over_its_real_cells_
  only and test_grid_aft_conv_is_stable_with_keys_in_a_range_of_fifty (4×4, kernel 3)."""
  grid = (3, 5)
  L = grid[0] * grid[1]
  x, mask = _inputs(L)
  module, variables = _module(grid, kernel_size, x=x)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  want = _grid_reference(x, mask, variables, grid)
  assert_close_sums(got[mask], want[mask], n_terms=_n_terms(L, kernel_size))


@pytest.mark.parametrize("num_heads", [1, D])
def test_grid_aft_conv_matches_the_formula_with_one_head_and_one_head_per_channel(num_heads):
  grid = (3, 4)
  x, mask = _inputs(12)
  module, variables = _module(grid, 3, num_heads=num_heads, x=x)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  assert_close_sums(got[mask], _grid_reference(x, mask, variables, grid)[mask], n_terms=_n_terms(12, 3))


@pytest.mark.parametrize("extra", [1, 2])
def test_leading_positions_before_the_grid_take_part_in_the_global_sums_only(extra):
  """A [CLS] vector (or two) before the 3×4 cells: w = 0 between it and every position, both ways."""
  grid, L = (3, 4), 12 + extra
  x, mask = _inputs(L)
  module, variables = _module(grid, 3, x=x)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  assert_close_sums(got[mask], _grid_reference(x, mask, variables, grid)[mask], n_terms=_n_terms(L, 3))
  # The bias matters on the grid and not at the leading positions: with a zero kernel (AFT-simple) the cells' outputs
  # change and the leading positions' do not.
  flat = {
    "params": {**variables["params"], "gamma": np.zeros((2, 1), np.float32), "beta": np.zeros((2, 1), np.float32)}
  }
  simple = np.asarray(jax.jit(module.apply)(flat, x, mask=mask))
  assert_close_sums(got[:, :extra], simple[:, :extra], n_terms=_n_terms(L, 3))
  assert np.abs(got[:, extra:] - simple[:, extra:]).max() > 1e-2


def test_a_padded_row_sums_over_its_real_cells_only():
  """The second image has its last 5 cells and one in the middle padded; their inputs are made huge, so any leak of
  a padded position into the sums would show."""
  grid, L = (4, 4), 16
  x, mask = _inputs(L, padded=5)
  mask[1, 6] = False
  x = np.where(mask[..., None], x, 40.0).astype(np.float32)
  module, variables = _module(grid, 3, x=x)
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  want = _grid_reference(x, mask, variables, grid)
  assert_close_sums(got[mask], want[mask], n_terms=_n_terms(L, 3))


def test_grid_aft_conv_in_bfloat16_matches_the_formula_loosely():
  """bfloat16 input: the projections round to bfloat16 (the reference takes the bfloat16-rounded input), the sums
  stay float32. Tolerance: D bfloat16 roundings (8 bits) of the output's size."""
  grid, L = (3, 4), 13
  x, mask = _inputs(L)
  module, variables = _module(grid, 3, x=x)
  x_bf16 = jnp.asarray(x, jnp.bfloat16)
  got = jax.jit(module.apply)(variables, x_bf16, mask=mask)
  assert got.dtype == jnp.bfloat16
  want = _grid_reference(np.asarray(x_bf16, np.float32), mask, variables, grid)
  assert_close_sums(np.asarray(got, np.float32)[mask], want[mask], n_terms=D, dtype="bfloat16")


def test_grid_aft_conv_is_stable_with_keys_in_a_range_of_fifty():
  """Keys spanning ±50 (e^50 overflows nothing only once the maximum is subtracted): still the formula. A key's
  float32 rounding moves its weight by |K|·eps relative, so the sums are held to ~50 more roundings."""
  grid, L = (4, 4), 17
  x, mask = _inputs(L)
  module, variables = _module(grid, 3, x=x)
  params = variables["params"]
  k = x @ np.asarray(params["key"]["kernel"]) + np.asarray(params["key"]["bias"])
  params = {
    **params,
    "key": {
      "kernel": np.asarray(params["key"]["kernel"]) * (50 / np.abs(k).max()),
      "bias": np.asarray(params["key"]["bias"]),
    },
  }
  variables = {"params": params}
  k = x @ params["key"]["kernel"]
  assert np.abs(k).max() == pytest.approx(50, rel=1e-3) and k.min() < -20 and k.max() > 20
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  assert_close_sums(got[mask], _grid_reference(x, mask, variables, grid)[mask], n_terms=_n_terms(L, 3) + 50)


# ---------------------------------------------------------------------------------------------------------------
# Geometry.


def test_shifting_the_image_content_shifts_the_interior_outputs():
  """A 3×3 patch of content on a zero background, at cells (2, 2) and then (3, 4) of an 8×9 grid (margins ≥ 2 cells,
  so the global sums see the same cells): an interior output (its whole 3×3 window inside the grid in both images)
  moves by (1, 2) with the content. Fails if the cells are laid out other than row by row (a transposed grid: the
  shift would then be (2, 1) cells of another grid). Equivariance holds for any kernel, however placed; the kernel's
  orientation and centring are fixed by the formula tests (test_a_flipped_kernel_gives_another_output)."""
  grid, S = (8, 9), 3
  R, C = grid
  content = np.random.default_rng(2).normal(size=(3, 3, D)).astype(np.float32)
  image_a, image_b = np.zeros((R, C, D), np.float32), np.zeros((R, C, D), np.float32)
  image_a[2:5, 2:5], image_b[3:6, 4:7] = content, content
  x = np.stack([image_a.reshape(R * C, D), image_b.reshape(R * C, D)])
  module, variables = _module(grid, S, x=x)
  y = np.asarray(jax.jit(module.apply)(variables, x)).reshape(B, R, C, D)
  y_a, y_b = y[0, 1 : R - 2, 1 : C - 3], y[1, 2 : R - 1, 3 : C - 1]  # cells (r, c) and (r + 1, c + 2), windows inside
  assert_close_sums(y_a, y_b, n_terms=_n_terms(R * C, S))
  assert np.abs(y_a).max() > 1e-2 and np.abs(y_a - y_a.mean(axis=(0, 1))).max() > 1e-2  # not a constant output


def test_a_flipped_kernel_gives_another_output():
  """The kernel is not symmetric, and flipping it (both axes) changes the output by far more than the formula test's
  tolerance: so that test fixes the kernel's orientation (kernel[:, a, b] weighs the cell (r + a − 1, c + b − 1))."""
  grid, L = (4, 5), 20
  x, mask = _inputs(L)
  module, variables = _module(grid, 3, x=x)
  raw = np.asarray(variables["params"]["kernel"])
  assert np.abs(raw - raw[:, ::-1, ::-1]).max() > 0.1
  flipped = {"params": {**variables["params"], "kernel": raw[:, ::-1, ::-1].copy()}}
  y, y_flipped = (np.asarray(jax.jit(module.apply)(v, x, mask=mask)) for v in (variables, flipped))
  assert np.abs(y - y_flipped)[mask].max() > 100 * float(np.abs(y).max()) * _n_terms(L, 3) * 1.2e-7
  want_flipped = _grid_reference(x, mask, flipped, grid)
  assert_close_sums(y_flipped[mask], want_flipped[mask], n_terms=_n_terms(L, 3))


@pytest.mark.parametrize("kernel_size", [1, 2, 3, 4])
@pytest.mark.parametrize("axis", ["row", "column"])
def test_a_grid_of_one_row_or_column_is_the_sequence_form_with_the_kernels_middle_line(kernel_size, axis):
  """grid (1, L) is the 1-D bidirectional AFT-conv whose kernel is the middle row kernel[:, (s−1)//2, :] of the
  reparameterised s×s kernel (the other rows reach outside the grid); grid (L, 1) likewise with the middle column.
  Both forms centre the kernel alike: entry j weighs the offset j − (s − 1)//2 (for even s, one more after than
  before). The 1-D module gets that line through its own reparameterisation: raw kernel = the line, γ = its std +
  1e-5, β = its mean."""
  L = 7
  grid = (1, L) if axis == "row" else (L, 1)
  x, mask = _inputs(L)
  module_2d, variables = _module(grid, kernel_size, x=x)
  w = _kernel(variables["params"])
  line = w[:, (kernel_size - 1) // 2, :] if axis == "row" else w[:, :, (kernel_size - 1) // 2]
  params_1d = {
    **variables["params"],
    "kernel": line.astype(np.float32),
    "gamma": (line.std(1, keepdims=True) + 1e-5).astype(np.float32),
    "beta": line.mean(1, keepdims=True).astype(np.float32),
  }
  module_1d = aft_conv.AFTConv(num_heads=2, kernel_size=kernel_size)
  y_1d = np.asarray(jax.jit(module_1d.apply)({"params": params_1d}, x, mask=mask))
  y_2d = np.asarray(jax.jit(module_2d.apply)(variables, x, mask=mask))
  assert_close_sums(y_2d[mask], y_1d[mask], n_terms=2 * _n_terms(L, kernel_size))
  # And the sequence form is the formula with the 1-D centring.
  want = _formula(x, mask, variables["params"], _sequence_bias(line, L))
  assert_close_sums(y_1d[mask], want[mask], n_terms=_n_terms(L, kernel_size))


# ---------------------------------------------------------------------------------------------------------------
# Finite gradients for every kernel size (std of one value is 0: its autodiff gradient was nan).


_LOSS_AND_GRADS = {}  # module → its jitted loss and gradients


def _loss_and_grads(module, variables, x, mask):
  """The loss Σ output · fixed random weights and its gradients, compiled once per module and shapes."""
  if module not in _LOSS_AND_GRADS:
    loss = lambda p, x, mask, w: (module.apply({"params": p}, x, mask=mask) * w).sum()
    _LOSS_AND_GRADS[module] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  return _LOSS_AND_GRADS[module](variables["params"], x, mask, weights)


def _all_finite(tree) -> bool:
  return all(bool(np.isfinite(np.asarray(a)).all()) for a in jax.tree.leaves(tree))


@pytest.mark.parametrize("kernel_size", [1, 2, 7])
@pytest.mark.parametrize("form", ["sequence", "causal sequence", "grid"])
def test_gradients_are_finite_for_every_kernel_size(kernel_size, form):
  """Through the module (the grid: 3×4 cells after a [CLS] position; the sequences: 13 positions, one row padded),
  with a random raw kernel and with one whose entries are all equal (std exactly 0; the same compiled program).
  Kernels of one entry, the smallest with a spread, and one reaching past a causal block (kernel 3, causal, random:
  tests/test_aft.py's gradients against the dense formula)."""
  grid = (3, 4) if form == "grid" else None
  x, mask = _inputs(13)
  module, random_variables = _module(grid, kernel_size, x=x, causal=form == "causal sequence")
  for entries in ("random", "all equal"):
    variables = random_variables
    if entries == "all equal":
      kernel = np.full(variables["params"]["kernel"].shape, 0.5, np.float32)
      variables = {"params": {**variables["params"], "kernel": kernel}}
    loss, (grads, grad_x) = _loss_and_grads(module, variables, x, mask)
    assert np.isfinite(loss) and _all_finite(grads) and _all_finite(grad_x), entries
    assert np.abs(np.asarray(grads["beta"])).max() > 0, entries  # β reaches the output
    if kernel_size == 1 or entries == "all equal":
      # w = β whatever the raw kernel and γ (the normalised part is 0): γ gets no gradient; a kernel of one entry
      # does not enter w at all.
      assert np.abs(np.asarray(grads["gamma"])).max() == 0, entries
      if kernel_size == 1:
        assert np.abs(np.asarray(grads["kernel"])).max() == 0, entries


def test_kernel_size_one_is_a_per_head_weight_of_each_position_on_itself():
  """s = 1: w_tt = β for every t (0 elsewhere), whatever the raw kernel and γ — the formula with that bias."""
  L = 9
  x, mask = _inputs(L)
  module, variables = _module(None, 1, x=x)
  beta = np.asarray(variables["params"]["beta"], np.float64)[:, 0]
  w = np.zeros((L, L, 2))
  w[np.arange(L), np.arange(L)] = beta
  got = np.asarray(jax.jit(module.apply)(variables, x, mask=mask))
  assert_close_sums(got[mask], _formula(x, mask, variables["params"], w)[mask], n_terms=_n_terms(L, 1))


def test_a_training_step_with_kernel_size_one_stays_finite():
  """A one-layer causal LM with aft_conv kernel_size=1, built by the users' builder: an SGD step on the next-token
  loss gives finite gradients, parameters and loss (γ, β = 0 at init: the nan came from √0's gradient, not from
  their values)."""
  config = mixer_config(
    "aft_conv", kernel_size=1, num_heads=2, d_model=16, d_ff=32, num_layers=1, max_len=8, causal=True, dropout=0.0
  )
  model = lm_model(config, vocab_size=16)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, size=(2, 8)), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]

  def loss_fn(params):
    logits = model.apply({"params": params}, tokens[:, :-1]).astype(jnp.float32)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1).mean()

  value_and_grad = jax.jit(jax.value_and_grad(loss_fn))
  loss, grads = value_and_grad(params)
  assert np.isfinite(loss) and _all_finite(grads)
  params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
  assert _all_finite(params) and np.isfinite(value_and_grad(params)[0])  # the same program, after the step


# ---------------------------------------------------------------------------------------------------------------
# Refusals and the FLOP count.


def test_a_grid_is_refused_when_causal_when_decoding_and_when_the_sequence_is_too_short():
  x = np.zeros((1, 12, D), np.float32)
  with pytest.raises(UserError, match="causal"):
    aft_conv.AFTConv(causal=True, num_heads=2, kernel_size=3, grid=(3, 4)).init(jax.random.key(0), x)
  with pytest.raises(UserError, match="decoding"):
    aft_conv.AFTConv(num_heads=2, kernel_size=3, grid=(3, 4)).init(jax.random.key(0), x, decode=True)
  with pytest.raises(UserError, match="needs 16 positions"):
    aft_conv.AFTConv(num_heads=2, kernel_size=3, grid=(4, 4)).init(jax.random.key(0), x)


def test_flops_2d_equals_the_traced_convolutions():
  """flops_2d against the convolutions of the traced program (tests/test_flops.py's walker), per position, with a
  [CLS] position before the 6×7 cells."""
  from test_flops import _matmul_flops  # pylint: disable=g-import-not-at-top

  d, grid, options = 32, (6, 7), {"num_heads": 4, "kernel_size": 5}
  L = 43
  module = aft_conv.AFTConv(grid=grid, **options)
  flops = []
  for batch in (2, 4):
    x = jnp.ones((batch, L, d))
    variables = jax.eval_shape(module.init, jax.random.key(0), x)
    flops.append(_matmul_flops(jax.make_jaxpr(lambda v, x: module.apply(v, x))(variables, x).jaxpr))
  projections = sum(
    layer["kernel"].size for name, layer in variables["params"].items() if name in ("query", "key", "value", "out")
  )
  traced = (flops[1] - flops[0]) / (2 * L) - 2 * projections
  assert aft_conv.flops_2d(options, L, d, cells=42) == pytest.approx(traced, rel=1e-9)
  assert aft_conv.flops_2d(options, 42, d) == 2 * 25 * (d + 4)
