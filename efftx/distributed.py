"""Joining a multi-process run (JAX's multi-controller runtime): the flags every entry point takes, and the call.

Every process runs the same command. On a TPU VM pod slice, under SLURM and in the other environments that
`jax.distributed.initialize()` detects by itself, `--distributed` is enough; elsewhere name the coordinator and
this process explicitly (e.g. two processes on one machine: `--coordinator_address=127.0.0.1:12355
--num_processes=2 --process_id=0`, and `--process_id=1` for the other).
"""

from __future__ import annotations

from absl import flags
import jax

from efftx.errors import UserError


def define_flags() -> None:
  global _DISTRIBUTED, _COORDINATOR, _NUM_PROCESSES, _PROCESS_ID
  _DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "Call jax.distributed.initialize() first, detecting the cluster (TPU pods, "
    "SLURM, ...); implied by the three flags below.",
  )
  _COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator service.")
  _NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "How many processes take part.")
  _PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes - 1.")


def initialize_from_flags() -> None:
  """jax.distributed.initialize() as the flags ask (nothing for a single-process run)."""
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise UserError(
        "--coordinator_address, --num_processes and --process_id go together (or none of them, "
        "with --distributed, where the cluster is detected)"
      )
    if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
      raise UserError(f"--process_id={_PROCESS_ID.value} must be in [0, --num_processes={_NUM_PROCESSES.value})")
    jax.distributed.initialize(*explicit)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
