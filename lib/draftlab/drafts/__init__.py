"""Stage 03 (notebook 03): EAGLE-3 and DFlash drafts for any verifier, built through speculators.

Takes the verifier and stage 01's data folder (aux layers, vocab mapping); gives a typed speculators
draft with its attention implementation chosen out loud and every shape checked against the verifier.
"""
