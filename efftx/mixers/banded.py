"""Blocks for banded (windowed) mixing in O(T·s·d): AFT-local and sliding-window attention share them.

The sequence is cut into N blocks of b positions; a position's window (|t − t'| < s, with b = min(s, L)) then lies
within its own block and the two beside it, so each block works on a context of 3b positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def band(L: int, window: int, causal: bool) -> tuple[int, jax.Array, jax.Array, jax.Array]:
  """(b, rows_NxB, cols_NxC, in_band_NxBxC): block size, each block's positions, its 3b context positions,
  and which (row, context) pairs are inside the window (and in range, and not in the future when causal)."""
  b = min(window, L)
  N = -(-L // b)
  rows_NxB = jnp.arange(N * b).reshape(N, b)
  cols_NxC = jnp.concatenate([rows_NxB - b, rows_NxB, rows_NxB + b], axis=1)
  offset_NxBxC = cols_NxC[:, None, :] - rows_NxB[:, :, None]
  in_band_NxBxC = (jnp.abs(offset_NxBxC) < window) & (cols_NxC[:, None, :] >= 0) & (cols_NxC[:, None, :] < L)
  if causal:
    in_band_NxBxC &= offset_NxBxC <= 0
  return b, rows_NxB, cols_NxC, in_band_NxBxC


def blocks(x_BxLx___: jax.Array, b: int) -> jax.Array:
  """B×L×… → B×N×b×… (zero-padded to N·b positions)."""
  B, L = x_BxLx___.shape[:2]
  N = -(-L // b)
  pad = [(0, 0), (0, N * b - L)] + [(0, 0)] * (x_BxLx___.ndim - 2)
  return jnp.pad(x_BxLx___, pad).reshape((B, N, b) + x_BxLx___.shape[2:])


def context(x_BxLx___: jax.Array, b: int) -> jax.Array:
  """B×L×… → B×N×3b×…: each block's previous, own and next block (zeros beyond the ends)."""
  x_BxNxbx___ = blocks(x_BxLx___, b)
  zeros = jnp.zeros_like(x_BxNxbx___[:, :1])
  prev = jnp.concatenate([zeros, x_BxNxbx___[:, :-1]], axis=1)
  nxt = jnp.concatenate([x_BxNxbx___[:, 1:], zeros], axis=1)
  return jnp.concatenate([prev, x_BxNxbx___, nxt], axis=2)


def unblocks(x_BxNxbx___: jax.Array, L: int) -> jax.Array:
  """B×N×b×… → B×L×…"""
  B, N, b = x_BxNxbx___.shape[:3]
  return x_BxNxbx___.reshape((B, N * b) + x_BxNxbx___.shape[3:])[:, :L]
