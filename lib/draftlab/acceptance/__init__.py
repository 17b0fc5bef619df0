"""Stage 05 (notebook 05): how often the verifier accepts a draft's guesses, measured by decoding.

Takes trained drafts (stage 04) and the bench/eval prompts (stage 01); gives acceptance per position,
tau against k, lossless checks against plain greedy decoding, and pictures of what was accepted.
"""
