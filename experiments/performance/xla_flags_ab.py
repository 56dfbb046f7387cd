"""XLA:CPU options against jaxlib's defaults, in one process: the same peer-shape training step (the harness's loss
and AdamW) compiled with and without the options (given as compiler_options, so nothing else differs), then timed
in alternation, so the machine's drift over minutes cancels. Cross-process A/Bs of XLA_FLAGS on this shared
2-core machine moved by ±15 % from run to run; this resolves a few per cent.

    python experiments/peers/xla_flags_ab.py 1024 identity_one_device xla_cpu_experimental_ynn_fusion_type=
    PJRT_NPROC=4 XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
      python experiments/peers/xla_flags_ab.py 1024 fnet xla_cpu_use_xnnpack=false   # the data-parallel factories

Arguments: length, a factories.py name, then NAME=VALUE options (XLA DebugOptions fields, without the "--").
"""
import pathlib
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position


def _value(text: str):
  return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


def main(length: int, name: str, options: dict, rounds: int = 8) -> None:
  step, params, opt_state, ids, labels = factories.harness_step(name, length)
  lowered = jax.jit(step).lower(params, opt_state, ids, labels)
  args = (params, opt_state, ids, labels)
  ms = factories.alternate({"defaults": (lowered.compile(), args), "options": (lowered.compile(options), args)},
                           rounds)
  print(f"{name} {length} ({jax.device_count()} devices) {options}: "
        + ", ".join(f"{label} {v:.0f} ms" for label, v in ms.items())
        + f"; speed-up {ms['defaults'] / ms['options']:.3f}")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2], {k: _value(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])})
