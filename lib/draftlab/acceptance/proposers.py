"""Proposers for speculative decoding: who drafts the next k tokens, and how they take back a rejection.

A proposer sees the committed tokens (prompt plus everything emitted, the last one not yet
processed by the verifier) and returns a `Proposal`: the drafted target ids and, for a model
draft, the distributions `q` they were drawn from (sampling verification needs them; `None`
means a point mass, as for prompt lookup). After each verifier pass `update` gets the verifier's
aux hidden states of the positions that pass processed and how many of them were kept, and rolls
any cache back to them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.drafts import norms


@dataclass
class Proposal:
    tokens: list[int]  # target-vocabulary ids, at most k
    q: torch.Tensor | None = None  # [len(tokens), target vocab] probabilities, None for a point mass


class Proposer:
    """The interface `accept.speculative_generate` drives; `layer_ids` says which aux states it needs."""

    name = "proposer"
    layer_ids: list[int] | None = None

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ids: list[int], k: int, temperature: float, generator: torch.Generator) -> Proposal:
        raise NotImplementedError

    def update(self, aux: torch.Tensor | None, n_kept: int) -> None:
        """aux: [n, n_aux*H] for the n positions of the last verifier pass; the first n_kept are committed."""


class NGramProposer(Proposer):
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (longest n
    first) and propose what followed it. No model, no cache; proposes nothing when there is no match."""

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n
        self.name = f"ngram (n {min_n}-{max_n})"

    def propose(self, ids, k, temperature, generator):
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start : start + n] == tail:
                    return Proposal(ids[start + n : start + n + k])
        return Proposal([])


class Eagle3Proposer(Proposer):
    """EAGLE-3 chain drafting with its own KV cache, aligned as speculators trains it (`shift_batch`):
    draft row t pairs token x[t+1] with the verifier's aux states of position t (fc over the
    concatenated aux slots) at position id t+1. Chain positions after the first are fed the draft's
    own decoder output (pre-norm, or post-norm when the config says `norm_output`), as in the TTT steps."""

    def __init__(self, model, target_vocab: int):
        self.model, self.target_vocab = model, target_vocab
        self.name = "eagle3"
        self.layer_ids = list(model.target_layer_ids)
        self.device = model.fc.weight.device
        n = model.lm_head.weight.shape[0]  # draft vocabulary; without d2t it is the target's
        self.d2t = (
            model.d2t.to(self.device) if model.d2t is not None else torch.zeros(n, dtype=torch.long, device=self.device)
        )

    def reset(self, prompt_ids):
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.n_real = 0  # draft rows in the cache fed with verifier states
        self.pending = torch.empty(0, self.model.fc.in_features, device=self.device, dtype=self.model.fc.weight.dtype)

    def _rows(self, tokens: torch.Tensor, hidden: torch.Tensor, start: int) -> torch.Tensor:
        """Run len(tokens) rows at positions start+1... through the decoder layers, appending to the cache."""
        m = self.model
        n = len(tokens)
        h = torch.cat([m.embed_tokens(tokens[None]), hidden[None]], dim=-1)
        past = self.cache.get_seq_length()
        pos = torch.arange(start + 1, start + 1 + n, device=self.device)[None]
        mask = torch.full((n, past + n), float("-inf"), device=self.device, dtype=h.dtype)
        mask = mask.triu(past + 1)[None, None]  # row i sees keys 0..past+i
        emb = m.rotary_emb(h, pos)
        for layer in m.layers:
            h = layer(
                h,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=self.cache,
                cache_position=torch.arange(past, past + n, device=self.device),
                position_embeddings=emb,
            )
        return h[0]

    def _head(self, h: torch.Tensor):
        m = self.model
        if m.config.norm_output:
            h = m.norm(h)
            return m.lm_head(h), h
        return m.lm_head(m.norm(h)), h

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        m = self.model
        n_new = len(self.pending)
        if self.n_real + n_new != len(ids) - 1:
            raise DraftlabError(
                f"EAGLE-3 proposer out of step: {self.n_real}+{n_new} draft "
                f"rows for {len(ids)} tokens; call reset(prompt) first."
            )
        toks = torch.tensor(ids[self.n_real + 1 :], device=self.device)
        h = self._rows(toks, m.fc(self._prep(self.pending)), self.n_real)[-1:]
        self.n_real, self.pending = len(ids) - 1, self.pending[:0]
        out, qs = [], []
        for i in range(k):
            logits, h = self._head(h)
            q = torch.softmax(logits[-1].float() / max(temperature, 1e-6), -1) if temperature > 0 else None
            idx = int(torch.multinomial(q, 1, generator=generator)) if q is not None else int(logits[-1].argmax())
            tok = idx + int(self.d2t[idx])
            out.append(tok)
            if q is not None:
                qs.append(self._to_target(q))
            if i + 1 < k:
                h = self._rows(torch.tensor([tok], device=self.device), h, len(ids) - 1 + i)
        return Proposal(out, torch.stack(qs) if qs else None)

    def _prep(self, aux):
        """speculators' optional input norms before fc (off by default), as in its forward."""
        m = self.model
        if m.input_norm is not None:
            aux = m.input_norm(aux)
        if m.fc_norm is not None:
            aux = torch.cat([nm(c) for nm, c in zip(m.fc_norm, aux.chunk(len(m.fc_norm), -1), strict=True)], -1)
        return aux

    def _to_target(self, q):
        """Draft-vocabulary probabilities placed at their target ids (`target = i + d2t[i]`); zero elsewhere."""
        full = torch.zeros(self.target_vocab, device=q.device)
        full[torch.arange(len(q), device=q.device) + self.d2t] = q
        return full

    def update(self, aux, n_kept):
        """Drop the speculative rows (crop to the rows fed with verifier states); queue the kept aux states."""
        crop(self.cache, self.n_real)
        self.pending = torch.cat([self.pending, aux[:n_kept].to(self.device, self.pending.dtype)])


class DFlashProposer(Proposer):
    """DFlash block drafting, as speculators trains it: one block [anchor, mask, ..., mask] at positions
    anchor..anchor+B-1, where the anchor is the last committed token; its queries attend (non-causally)
    the fc-projected verifier aux states of every position before the anchor and the block itself.
    Slot i predicts the token at anchor+i, so slots 1..k are the draft, all from one draft pass.
    No draft KV cache: the committed context is kept projected and re-attended each step (nothing
    speculative is stored, so nothing to roll back); at most B-1 tokens per step."""

    def __init__(self, model, target_vocab: int):
        self.model, self.target_vocab = model, target_vocab
        self.name, self.layer_ids = "dflash", list(model.target_layer_ids)
        self.device = model.fc.weight.device
        n = model.lm_head.weight.shape[0]
        self.d2t = (
            model.d2t.to(self.device) if model.d2t is not None else torch.zeros(n, dtype=torch.long, device=self.device)
        )

    def reset(self, prompt_ids):
        self.ctx = torch.empty(
            0,
            self.model.config.transformer_layer_config.hidden_size,
            device=self.device,
            dtype=self.model.fc.weight.dtype,
        )

    def update(self, aux, n_kept):
        self.ctx = torch.cat(
            [self.ctx, self.model.hidden_norm(self.model.fc(aux[:n_kept].to(self.device, self.ctx.dtype)))]
        )

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        m, n, size = self.model, len(ids) - 1, self.model.block_size
        if len(self.ctx) != n:
            raise DraftlabError(
                f"DFlash proposer out of step: {len(self.ctx)} context "
                f"states for {len(ids)} tokens; call reset(prompt) first."
            )
        block = torch.tensor([[ids[-1]] + [m.mask_token_id] * (size - 1)], device=self.device)
        h = m.embed_tokens(block)
        pos = torch.arange(n + size, device=self.device)[None]  # context 0..n-1, block n..n+B-1
        emb = m.rotary_emb(h, pos)
        mask = torch.zeros(1, 1, size, n + size, device=self.device, dtype=h.dtype)
        for layer in m.layers:
            h = layer(
                target_hidden=self.ctx[None],
                hidden_states=h,
                attention_mask=mask,
                position_ids=pos,
                position_embeddings=emb,
            )
        logits = m.lm_head(m.norm(h))[0, 1 : 1 + min(k, size - 1)].float()
        if temperature == 0:
            idx = logits.argmax(-1)
            return Proposal((idx + self.d2t[idx]).tolist())
        q = torch.softmax(logits / temperature, -1)  # block slots are drawn independently
        idx = torch.multinomial(q, 1, generator=generator)[:, 0]
        full = torch.zeros(len(q), self.target_vocab, device=q.device)
        full[:, torch.arange(q.shape[1], device=q.device) + self.d2t] = q
        return Proposal((idx + self.d2t[idx]).tolist(), full)


def make_proposer(draft, target_vocab: int) -> Proposer:
    """The proposer for a loaded draft (`load_draft`), by its kind."""
    return {"eagle3": Eagle3Proposer, "dflash": DFlashProposer}[draft.kind](draft.model, target_vocab)


def crop(cache, keep: int) -> None:
    """Roll a DynamicCache back to its first `keep` positions (transformers 5: a negative count removes)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


def load_draft(path, verifier):
    """A stage-04 checkpoint (`RunLayout.final(kind)`), or a speculators `--save-path`
    (its checkpoint found by `launch.find_checkpoint`), as a checked draftlab `Draft`.
    `_attn_implementation` is not serialised; drafting with a KV cache uses sdpa (or eager), never flex."""
    from speculators import SpeculatorModel

    from draftlab.drafts.draft import Draft, _train_config, head_view, verify
    from draftlab.training.checkpoint import load_model, saved_dtype
    from draftlab.training.launch import find_checkpoint

    path = Path(path)
    if not (path / "config.json").exists():
        path = find_checkpoint(path)  # speculators' <save>/<epoch>/ layout, or an error naming the fix
    kind = json.loads((path / "config.json").read_text()).get("speculators_model_type")
    if kind not in ("eagle3", "dflash"):
        raise DraftlabError(f"{path}/config.json is a {kind!r} speculator; draftlab drafts with eagle3 or dflash.")
    cls = SpeculatorModel.registry[kind]
    attention = "eager" if str(verifier.device) == "mps" else "sdpa"
    model = load_model(path, cls, attention, verifier.device, verifier.dtype).eval()
    norms.match_verifier_norm(model, verifier)
    if model.config.transformer_layer_config.hidden_size != verifier.hidden_size:
        raise DraftlabError(
            f"draft {path} has hidden size {model.config.transformer_layer_config.hidden_size}, "
            f"the verifier {verifier.hidden_size}: it was trained for another verifier."
        )
    flat = {
        "loss_implementation": "eager",
        "target_layer_ids": model.target_layer_ids if kind == "eagle3" else None,
        "draft_vocab_size": model.config.draft_vocab_size,
    }
    if kind == "eagle3":
        flat["ttt_steps"] = model.config.speculators_config.proposal_methods[0].speculative_tokens
    train_config = _train_config(kind, head_view(verifier), **{k: v for k, v in flat.items() if v is not None})
    train_kwargs, _ = cls.get_trainer_kwargs(**train_config.flatten())
    draft = Draft(
        model, kind, verifier, train_config, train_kwargs, {"checkpoint": (str(path), "loaded for drafting, sdpa")}
    )
    verify(draft, saved_dtype(path))
    return draft
