"""Stage 04 (notebook 04): short training runs of a draft, resumable, on CPU, one GPU or torchrun.

Takes a built draft and stage 01's train/eval splits; gives checkpoints, per-step metrics and a
`final/` speculators folder that notebook 05 and `vllm serve` load.
"""
