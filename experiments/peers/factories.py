"""efftx models for the peer benchmark (../shared/bench/peers.py --extra NAME=factories:<mixer>).

`factory(cfg, seq)` builds the peers' model through efftx's own builder (efftx.bench.lm_model →
efftx.model.build_model): d, layers, heads, FF and vocabulary from the harness's `cfg`, dropout 0, and the peers'
block: post-LN (BERT's and HF FNet's layout: the embeddings normalised, a LayerNorm after each residual sum),
exact-erf GELU, LayerNorm epsilon 1e-12, FNet with its embedding projection. Logits at every position.
`factory.mixer_flops_per_token(cfg, seq)` is the mixer's own count (MixerSpec.flops) for the harness's MFU.

Differences from the peers, precisely: HF BERT adds a token-type embedding (one type: a constant vector) that
efftx does not; HF's position embeddings cover max(512, seq) positions, efftx's exactly seq; everything else
(parameters, FLOPs, the loss and AdamW the harness builds) is the same. `identity` is fnet's model with the mixer
replaced by y = x and without FNet's embedding projection (so it has exactly the layers every model shares): the
step without any mixing, for profiling the shared machinery.
"""
import flax.linen as nn

from efftx import bench
from efftx import config as config_lib
from efftx.mixers import MIXERS


def _config(mixer: str, cfg: dict, seq: int, **mixer_options):
  config = config_lib.default_config(mixer)
  config.model.update(d_model=cfg["d"], num_layers=cfg["layers"], d_ff=cfg["ff"], max_len=seq, dropout=0.0,
                      block_layout="post_ln", activation="gelu", norm_eps=1e-12, embed_projection=mixer == "fnet")
  config_lib.set_where_declared(config.mixer, num_heads=cfg["heads"], **mixer_options)
  return config


def _factory(mixer: str, **mixer_options):
  def factory(cfg: dict, seq: int) -> nn.Module:
    return bench.lm_model(_config(mixer, cfg, seq, **mixer_options), cfg["vocab"])

  def mixer_flops_per_token(cfg: dict, seq: int) -> float:
    config = _config(mixer, cfg, seq, **mixer_options)
    return cfg["layers"] * MIXERS[mixer].train_flops(dict(config.mixer), seq, cfg["d"], False)

  factory.mixer_flops_per_token = mixer_flops_per_token
  factory.__name__ = mixer
  return factory


fnet = _factory("fnet")
attention = _factory("attention")
aft_simple = _factory("aft_simple")
aft_local = _factory("aft_local")
linear = _factory("linear")


class _Identity(nn.Module):
  causal: bool = False

  def __call__(self, x_BxLxD, mask=None, deterministic=True):
    del mask, deterministic
    return x_BxLxD


def identity(cfg: dict, seq: int) -> nn.Module:
  return fnet(cfg, seq).clone(make_mixer=lambda name: _Identity(name=name), embed_projection=False)


identity.mixer_flops_per_token = lambda cfg, seq: 0.0
