"""A run's final/: the trained draft as speculators saves it (config.json, model.safetensors: what vLLM and notebook 05
load), stamped with the verifier it was trained for, written whole and read back before the runs it set aside go.

The stamp (`STAMP`, beside config.json; speculators and vLLM read neither it nor any file they do not know) names
the verifier by path and fingerprint (`data.verifier_dir.fingerprint`): a draft loaded against another verifier
of the same shape is refused by name (`check_trained_for`), for every family, DFlash's too, whose checkpoint
holds no frozen tensor of the verifier to compare (`drafts.validate.verify` compares those it holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.training import checkpoint as ckpt
from draftlab.training.launch import checkpoint_fault
from draftlab.training.start import kept, on_finish
from draftlab.writes import publish

STAMP = "draftlab.json"


def write_final(run_dir: Path, draft) -> Path:
    """`final/`: a plain speculators folder for vLLM and notebook 05, and the stamp of its verifier."""

    def fill(tmp: Path) -> None:
        draft.model.save_pretrained(tmp)
        v = draft.verifier
        (tmp / STAMP).write_text(json.dumps({"verifier_path": str(v.path), "verifier_fingerprint": v.fingerprint}))

    kept = f"the checkpoints in {Path(run_dir) / 'checkpoints'} are kept (resume=True continues from the last)"
    return publish(Path(run_dir) / "final", fill, "the trained draft, final/", kept)


def check_trained_for(folder: Path, verifier) -> None:
    """Refuse a draft stamped (`write_final`) for another verifier than `verifier`, saying which, and whether a
    model of the same shape now sits where its verifier was. A folder without a stamp (a speculators save, or one
    written before stamps) is left to the frozen-tensor check."""
    from draftlab.files import read_json

    stamp = Path(folder) / STAMP
    if not stamp.exists():
        return
    rec = read_json(stamp, f"Delete {stamp} to load the draft unstamped, or re-run notebook 04 to write it again.")
    if rec.get("verifier_fingerprint") == verifier.fingerprint:
        return
    was = Path(str(rec.get("verifier_path")))
    why = (
        f"the verifier it was trained for was at this very path, but the model there now is another one of the "
        f"same shape (fingerprint {verifier.fingerprint}, not {rec.get('verifier_fingerprint')}: replaced since, "
        "e.g. by a fine-tune or another download)"
        if was.resolve() == Path(verifier.path).resolve()
        else f"it was trained for the verifier at {was} (fingerprint {rec.get('verifier_fingerprint')}), and "
        f"{verifier.path} is another (fingerprint {verifier.fingerprint})"
    )
    raise DraftlabError(
        f"draft {folder} does not belong to verifier {verifier.path}: {why}. Load it with the verifier it was "
        "trained for, or train a draft for this one (notebooks 01 and 04)."
    )


def finish(run_dir: Path, draft) -> Path:
    """The run's final/ written (`write_final`), read back through speculators (`checkpoint.reload`, the
    checks of a reloaded draft) and compared with the draft trained, tensor for tensor; only then do the runs it
    set aside go (`on_finish`). A final/ that does not load is removed, so the same command resumes from the last
    checkpoint (the run's last step) and writes it again."""
    try:
        final = write_final(run_dir, draft)
    except DraftlabError as e:
        raise DraftlabError(f"{e}{kept(run_dir)}") from None
    fault = checkpoint_fault(final)  # a cut file named before speculators reads it
    if fault is None:
        try:
            state = ckpt.reload(final, draft).model.state_dict()
            wrong = [k for k, t in draft.model.state_dict().items() if not torch.equal(t, state[k])]
            fault = f"its {wrong[0]} differs from the trained draft's" if wrong else None
        except Exception as e:  # noqa: BLE001 (whatever stops it loading is named, and the run resumes)
            fault = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if fault:
        shutil.rmtree(final, ignore_errors=True)
        raise DraftlabError(
            f"{final} was written but does not load as the draft just trained ({fault}), so it was removed. Run "
            f"the same command again: it resumes from the last checkpoint, {ckpt.latest(run_dir)}, and writes "
            f"final/ again{kept(run_dir)}."
        )
    on_finish(run_dir)
    return final
