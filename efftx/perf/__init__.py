"""Measurement tools: they time, profile and lower the training step that the core builds.

The tools import the core; the core (train, evaluate, sample, model, mixers, data, objectives, sweep) never imports
efftx.perf. Each command keeps its short name through an alias module, efftx/<name>.py:

    python -m efftx.ab         # two variants of the training step timed in turn, on one machine
    python -m efftx.bench      # what each mixer costs: tokens/s and memory by length, FFT and attention paths, ...
    python -m efftx.peers      # efftx's step beside PyTorch/Hugging Face and plain Flax at one shape
    python -m efftx.gpu_bench  # every mixer's step beside Hugging Face's BERT and FNet on one GPU
    python -m efftx.lowering   # a run's steps lowered for a TPU and a GPU from any machine

step.py holds the training step they share: a variant (a config file, or a mixer at the peer shape) compiled as
efftx.train compiles it. profiling.py sums a jax.profiler trace's kernels by what they compute (peers --profile).
decode.py times one decoding step through the mixers' caches by position (bench --mode=decode).
"""
