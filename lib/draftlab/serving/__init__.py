"""The serving engine (stages 01 and 05): a real `vllm serve`, started and always stopped by draftlab.

Takes the verifier and optionally a trained draft; gives vLLM's own acceptance counters, its answers
and hidden states, and the same figures as draftlab's loop beside them.
"""
