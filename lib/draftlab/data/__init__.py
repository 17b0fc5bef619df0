"""Stage 01 (notebook 01): the verifier, its prompts and answers, and the training data drafts learn from.

Takes a verifier (the embedded SmolLM2 or a local HF directory) and prompts from installed packages;
gives tokenised splits with the verifier's hidden states (speculators' layout), a manifest, a draft vocab.
"""
