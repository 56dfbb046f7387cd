"""Deliberate breaks (issue: the trimmed suite still catches bugs): each one patched into a fresh clone of this
checkout, the tests named beside it run, the failures listed. `python experiments/suite/breaks.py` from the
checkout's root (about 12 minutes on 2 cores); the clone goes to $TMPDIR/efftx-breaks."""

import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLONE = os.path.join(tempfile.gettempdir(), "efftx-breaks")
BREAKS = [
  (
    "causal mask off by one (attention sees the next key)",
    "efftx/mixers/attention.py",
    "allowed & (k_pos[None, None, None, :] <= q_pos[None, None, :, None])",
    "allowed & (k_pos[None, None, None, :] <= q_pos[None, None, :, None] + 1)",
    ["tests/test_mixers.py", "tests/test_attention_dropout.py"],
  ),
  (
    "padding mixed in (AFT's keys ignore the mask)",
    "efftx/mixers/aft.py",
    "valid_BxLx1 = jnp.ones(k_BxLxC.shape[:2] + (1,), bool) if mask_BxL is None else mask_BxL[:, :, None]\n  k_max",
    "valid_BxLx1 = jnp.ones(k_BxLxC.shape[:2] + (1,), bool)\n  k_max",
    ["tests/test_mixers.py", "tests/test_aft.py"],
  ),
  (
    "a decode step that skips the cache (gated recurrence keeps its old state)",
    "efftx/mixers/recurrence.py",
    'return jnp.einsum("bhkv,bhk->bhv", state, q_BxHxK.astype(jnp.float32)), state\n',
    'return jnp.einsum("bhkv,bhk->bhv", state, q_BxHxK.astype(jnp.float32)), state_BxHxKxV\n',
    ["tests/test_mixers.py", "tests/test_recurrence.py", "tests/test_mamba2.py", "tests/test_lm.py"],
  ),
  (
    "a resume that restarts the data (the position ignores the step)",
    "efftx/data/pipeline.py",
    "[index::count][start_step:]",
    "[index::count][0:]",
    ["tests/test_faults.py", "tests/test_train.py", "tests/test_tasks.py"],
  ),
  (
    "a CLI error that prints a traceback",
    "efftx/cli.py",
    "  except UserError as e:\n    exit_with(prog, str(e))",
    "  except UserError as e:\n    raise",
    ["tests/test_cli.py"],
  ),
]
for what, path, old, new, tests in BREAKS:
  subprocess.run(["rm", "-rf", CLONE], check=True)
  subprocess.run(["git", "clone", "-q", REPO, CLONE], check=True)
  p = os.path.join(CLONE, path)
  s = open(p).read()
  assert s.count(old) == 1, (what, s.count(old))
  open(p, "w").write(s.replace(old, new))
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-n",
      "2",
      "-p",
      "no:cacheprovider",
      "--durations=0",
      "-o",
      "addopts=--dist=loadgroup",
      *tests,
    ],
    cwd=CLONE,
    capture_output=True,
    text=True,
  ).stdout
  failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)))
  summary = out.strip().splitlines()[-1]
  print(f"## {what}\n{path}: {summary}")
  for f in failed[:12]:
    print("  ", f)
  if len(failed) > 12:
    print(f"   ... and {len(failed) - 12} more")
  sys.stdout.flush()
