"""The pieces of a training run, shared by train, evaluate, sample, bench and the tests: the run's parts (task,
objective, model), the optimizer, the train state, and the train and eval steps (not yet jitted)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import optax

from efftx import model as model_lib
from efftx import objectives
from efftx.data import Task
from efftx.data import task_of
from efftx.mixers import MIXERS


@dataclasses.dataclass(frozen=True)
class Parts:
  """What a config trains: the task (data, vocabulary), the objective (head, loss, metrics) and the model."""

  task: Task
  objective: objectives.Objective
  model: model_lib.Transformer


def parts(config: ml_collections.ConfigDict) -> Parts:
  """The task, objective and model of a run config (config.data.task, config.data.objective, config.model and
  config.mixer). Raises UserError where the objective does not fit the task or the mixer options are invalid."""
  task = task_of(config)
  objective = objectives.for_run(config, task)
  vocab_size = task.vocab(config.data.variant)
  head = objective.head(vocab_size, task.classes(config.data.variant), config.model.pooling)
  return Parts(task, objective, model_lib.build_model(config, head, vocab_size, task.image_shape))


# The parameters AdamW decays, by leaf name: weight matrices and embeddings, not biases, norm scales or position
# biases. By name because shapes do not tell (DenseGeneral biases are 3-D; the reversible stack adds a layer axis to
# every leaf): every dense layer's "kernel", every "embedding", and the weight matrices of their own that mixers
# declare (MixerSpec.decayed: linear_mixing's learned mixing matrices).
DECAYED = frozenset({"kernel", "embedding"}.union(*(spec.decayed for spec in MIXERS.values())))


def decay_mask(params: Any) -> Any:
  """params' tree with True at the leaves AdamW decays (their name is in DECAYED), False elsewhere."""
  return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) in DECAYED, params)


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(config: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW (decaying the weights `decay_mask` picks, or every parameter with optim.decay_all) with linear warmup
  and cosine decay to 0 at total_steps (its value held for optim.schedule_every steps at a time), after
  global-norm gradient clipping."""
  o = config.optim
  smooth = optax.warmup_cosine_decay_schedule(
    0.0, o.learning_rate, warmup_steps=o.warmup_steps, decay_steps=max(config.total_steps, o.warmup_steps + 1)
  )
  every = o.get("schedule_every", 1)
  schedule = smooth if every == 1 else (lambda count: smooth(count // every * every))
  tx = optax.chain(
    optax.clip_by_global_norm(o.grad_clip) if o.grad_clip else optax.identity(),
    optax.adamw(schedule, weight_decay=o.weight_decay, mask=None if o.get("decay_all") else decay_mask),
  )
  return tx, schedule


def init_params(model: model_lib.Transformer, key: jax.Array) -> Any:
  """Fresh parameters (shapes from one sequence of model.max_len tokens; model_lib.initialize)."""
  return model_lib.initialize(model, key)


def create_state(
  model: model_lib.Transformer, tx: optax.GradientTransformation, key: jax.Array | None = None, params: Any = None
) -> TrainState:
  """Step 0 with `params` (fresh from `key` if not given) and a fresh optimizer state. Wrap it in jax.jit with
  out_shardings to create it sharded, or in jax.eval_shape for its shapes."""
  params = init_params(model, key) if params is None else params
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def make_train_step(
  model: model_lib.Transformer,
  objective: objectives.Objective,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  dropout_key: jax.Array,
  token_unit: str | None = None,
):
  """(state, batch) → (state, metrics): loss, gradients, the AdamW update, the objective's metrics (and
  nonfinite_grad_leaf: see efftx.metrics.DIAGNOSTICS)."""

  def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    rng = jax.random.fold_in(dropout_key, state.step)  # dropout differs every step, reproducibly

    def loss_fn(params):
      logits = model.apply(
        {"params": params},
        batch["tokens"],
        mask=batch["mask"],
        deterministic=False,
        positions=batch.get("positions"),
        token_types=batch.get("token_types"),
        rngs={"dropout": rng},
      )
      sums = objective.loss_sums(logits, batch, jnp.ones(batch["tokens"].shape[:1], jnp.float32))
      return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)
    finite_G = jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
    metrics = {
      **objective.summarize(sums, token_unit),
      "grad_norm": optax.tree.norm(grads),
      "learning_rate": schedule(state.step),
      # the first parameter whose gradient is not finite (-1: none), named when a run diverges
      "nonfinite_grad_leaf": jnp.where(finite_G.all(), -1, jnp.argmin(finite_G)),
    }
    return new_state, metrics

  return train_step


def make_eval_step(model: model_lib.Transformer, objective: objectives.Objective):
  """(params, batch) → the objective's loss sums; batch["weight"] is 0 on padding rows."""

  def eval_step(params, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    logits = model.apply(
      {"params": params},
      batch["tokens"],
      mask=batch["mask"],
      deterministic=True,
      positions=batch.get("positions"),
      token_types=batch.get("token_types"),
    )
    return objective.loss_sums(logits, batch, batch["weight"])

  return eval_step
