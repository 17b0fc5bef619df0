"""The draft families draftlab takes through its stages: speculators' model types, looked up by name.

A family is what speculators registers under `speculators_model_type` (`SpeculatorModel.registry`).
Its record here says only what every stage may ask (its layout, the aux layers it reads by default,
whether draftlab takes it and why not); what one stage does with a family lives in that stage's own
module for it: `masks/<name>.py` (02), `drafts/<name>.py` (03 and 04), `acceptance/<name>.py` (05),
found through `stage_module`. A new family is one record here and one module per stage.

Two layouts cover the families speculators 0.9.0 trains for a verifier without MTP layers:
- `chain`: EAGLE-3 and its descendants draft one token per step from the verifier's aux states and their
  own previous state; training unrolls the steps (training-time test) over a shifted pack.
- `block`: DFlash and its descendants draft a block of positions at once after an anchor, conditioned on
  the verifier's states before it; training samples anchors in the pack.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from draftlab import DraftlabError

LAYOUTS = ("chain", "block")


@dataclass(frozen=True)
class Family:
    name: str  # speculators' model type: the profile's draft_kinds entry, the run's draft folder
    title: str  # how papers and tables name it
    layout: str | None  # "chain" or "block" (LAYOUTS); None for a family draftlab refuses
    about: str  # one line: what the family adds
    refused: str | None = None  # why draftlab cannot take it (every stage says so, by name)
    vllm: str | None = None  # vLLM's speculative `method` serving it; None: vLLM does not (why: `vllm_refused`)
    vllm_refused: str | None = None  # vLLM's own words, where it cannot serve the family
    vllm_options: tuple = ()  # further `--speculative-config` keys the family needs, as (key, value) pairs

    def default_layer_ids(self, num_layers: int, n: int = 5) -> list[int]:
        """Chain: speculators' EAGLE-3 default [2, L//2, L-3]. Block: n ids spread evenly over the depth."""
        if self.layout == "chain":
            return [2, num_layers // 2, num_layers - 3]
        return sorted({round(1 + i * (num_layers - 3) / (n - 1)) for i in range(n)})


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "eagle3",
            "EAGLE-3",
            "chain",
            "one token per step from three aux layers, trained by training-time test",
            vllm="eagle3",
        ),
        Family(
            "peagle",
            "P-EAGLE",
            "chain",
            "EAGLE-3 drafting k tokens in one forward (mask tokens, parallel groups)",
            vllm="eagle3",  # vLLM has no "peagle" method: EAGLE-3 with parallel drafting, said out loud, since
            vllm_options=(("parallel_drafting", True),),  # without it vLLM drafts a P-EAGLE one token a step, silently
        ),
        Family(
            "dflash",
            "DFlash",
            "block",
            "a block of tokens in one forward after an anchor, block-diffusion style",
            vllm="dflash",
        ),
        Family(
            "dflash2",
            "DFlash-2",
            "block",
            "DFlash plus local dynamic convolutions and a candidate selector",
            vllm_refused="vLLM 0.32 (CPU) says 'Model Runner V1 does not support: DFlash candidate-head drafts' (its "
            "V2 runner needs Triton); vLLM 0.25 (CUDA) says 'Expected one of: {eagle3, peagle, dflash, dspark}'",
        ),
        Family(
            "dspark",
            "DSpark",
            "block",
            "DFlash plus a Markov logit-bias head and a confidence head",
            vllm_refused="vLLM 0.32 (CPU) says 'Model Runner V1 does not support: dspark speculative decoding'; vLLM "
            "0.25 (CUDA) serves `dspark` but always reads the block's first slot as the bonus token, the opposite of "
            "speculators' default sample_from_anchor=True, so it would serve another layout than the one trained",
        ),
        Family(
            "xpress",
            "XPress",
            "block",
            "DFlash plus a causal refiner resolved by Jacobi passes",
            vllm_refused="vLLM 0.32 and 0.25 say 'Expected one of: {eagle3, peagle, dflash, dflash2, dspark}. Please "
            "ensure you're loading a speculators-format model.' (no XPress refiner in either)",
        ),
        Family(
            "mtp",
            "MTP",
            None,
            "the verifier's own multi-token-prediction layers, fine-tuned",
            refused="speculators' mtp fine-tunes the verifier's own MTP layers (its words: 'No keys with prefix 'mtp.' "
            "found', 'Unsupported MTP model type 'llama''): a verifier without them (no `num_nextn_predict_layers`, "
            "as every verifier draftlab takes) has nothing to start from. Pick another family in draft_kinds.",
            vllm_refused="vLLM serves MTP from the verifier's own checkpoint (method 'mtp', no draft folder)",
        ),
    )
}


def family(name: str, take: bool = True) -> Family:
    """The family named `name`; with `take`, refused by name where draftlab cannot take it through its stages."""
    if name not in FAMILIES:
        raise DraftlabError(f"draft family {name!r} unknown; draftlab knows {', '.join(FAMILIES)}.")
    f = FAMILIES[name]
    if take and f.refused:
        raise DraftlabError(f"draft family {name!r} ({f.title}) refused: {f.refused}")
    return f


def partition(kinds) -> tuple[list[str], dict[str, str]]:
    """A profile's `draft_kinds` split into the families draftlab takes and {family: why not} for the rest, so a
    notebook goes on with the first and shows the second (an unknown name is an error: a typo, not a choice)."""
    fams = [family(k, take=False) for k in kinds]
    return [f.name for f in fams if not f.refused], {f.name: f.refused for f in fams if f.refused}


def taken() -> list[str]:
    """The families draftlab takes through every stage, in the order tables list them."""
    return [n for n, f in FAMILIES.items() if not f.refused]


def stage_module(stage: str, name: str):
    """`draftlab.<stage>.<name>`: what stage `stage` (masks, drafts, acceptance) does for family `name`."""
    family(name)
    try:
        return importlib.import_module(f"draftlab.{stage}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"draftlab.{stage}.{name}":
            raise
        raise DraftlabError(
            f"draftlab.{stage} has no module for the {name!r} family (lib/draftlab/{stage}/{name}.py)"
        ) from None
