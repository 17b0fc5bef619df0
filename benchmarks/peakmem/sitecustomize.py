"""Peak GPU memory of a process started with this folder on PYTHONPATH, for a command that does not
report it (speculators' trainer under torchrun; `gpu_pipeline.sh torchrun`): at exit, a process that
used CUDA and is not a multiprocessing child (a DataLoader worker) appends one JSON line with
torch.cuda.max_memory_allocated / max_memory_reserved to $DRAFTLAB_PEAK_FILE. The command is unchanged;
a sitecustomize this one shadows (the interpreter's own) is still run."""

import atexit
import importlib.machinery
import importlib.util
import json
import os
import sys


def _report():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return
    with open(os.environ["DRAFTLAB_PEAK_FILE"], "a") as f:
        f.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "local_rank": os.environ.get("LOCAL_RANK"),
                    "argv": sys.argv[:3],
                    "max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
                    "max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
                }
            )
            + "\n"
        )


if os.environ.get("DRAFTLAB_PEAK_FILE"):
    atexit.register(_report)

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
