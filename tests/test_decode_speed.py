"""efftx.perf.decode: one decoding step timed at given positions runs (no timing is asserted), and a mixer without
a cache is refused in one line."""

import pytest

from efftx.errors import UserError
from efftx.perf import decode

TINY = {"d_model": 32, "num_layers": 1, "d_ff": 64}


def test_decode_tokens_per_sec_runs():
  rates = decode.decode_tokens_per_sec("rg_lru", positions=(3,), min_seconds=0, overrides=TINY)
  assert list(rates) == [3] and all(r > 0 for r in rates.values())


def test_a_mixer_without_a_cache_is_refused():
  assert {"attention", "mamba2", "mamba", "gla", "gated_deltanet", "retnet", "rg_lru"} <= set(decode.decoding_mixers())
  with pytest.raises(UserError, match="'fnet' does not decode"):
    decode.decode_tokens_per_sec("fnet", positions=(3,), overrides=TINY)
