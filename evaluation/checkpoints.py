"""Load the model (GPT-2 or LLaMA) of a checkpoint written by train.py, for every evaluation command (scoring,
export, sampling).

A checkpoint file or a run directory (its newest loadable checkpoint); each way a file can fail to be one gives a
ValueError or FileNotFoundError with one line that says which.
"""
from pathlib import Path

import torch
from torch import nn

from data.c4 import TOKENIZER as C4_TOKENIZER
from data.shards import reads_gpt2_tokens
from model import build_model, model_config
from training.checkpoint import (CHECKPOINT_NAME, CheckpointReadError, CorruptCheckpoint, UnreadableCheckpoints,
                                 checkpoint_dir, checkpoint_step, latest_checkpoint, load_checkpoint)
from training.metrics import read_metrics

# How often a reader lists a live run's checkpoints again when the newest was deleted before it was read (the run's
# pruning to train.keep_checkpoints, having saved a newer one) before it gives up: a checkpoint lives at least a
# checkpoint interval, so a second reading is seldom cut short too.
LIVE_RUN_READS = 5


def load_model(checkpoint: Path, device: torch.device = torch.device("cpu"),
               gpt2_text_for: str | None = None) -> tuple[nn.Module, Path]:
    """The model of a train.py checkpoint file or run directory (its newest loadable one), on ``device`` in eval
    mode, and the checkpoint file it came from. ``gpt2_text_for`` names what will feed it text in GPT-2's tokens
    (sampling, HellaSwag), which a model of other tokens is refused."""
    model, checkpoint, tokenizer = load_model_and_tokenizer(checkpoint, device)
    if gpt2_text_for and not reads_gpt2_tokens(tokenizer):
        raise ValueError(f"{checkpoint} was trained on the tokens of {tokenizer['name']}; {gpt2_text_for} encodes "
                         "text with GPT-2's tokenizer, which that model cannot read: compare it by its validation "
                         "perplexity (docs/c4.md)")
    return model, checkpoint


def load_model_and_tokenizer(checkpoint: Path, device: torch.device = torch.device("cpu"),
                             ) -> tuple[nn.Module, Path, dict | None]:
    """``load_model``'s model and checkpoint file, and whose token ids the model read (``trained_tokenizer``)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        raise FileNotFoundError(f"{checkpoint} does not exist: pass a run directory of train.py or one of its "
                                "checkpoints/ckpt_*.pt files")
    if checkpoint.is_dir():
        try:
            found = newest_checkpoint(checkpoint, device)
        except UnreadableCheckpoints:
            raise ValueError(f"none of the checkpoints in {checkpoint_dir(checkpoint)} can be read: pass a "
                             "readable checkpoint file instead") from None
        except CheckpointReadError as err:
            raise ValueError(str(err)) from None
        if found is None:
            raise FileNotFoundError(f"{checkpoint} holds no checkpoint ({checkpoint_dir(checkpoint)}/"
                                    "ckpt_*.pt): pass a run directory of train.py that has saved one, or a "
                                    "checkpoint file")
        checkpoint, state = found
    else:
        try:
            state = load_checkpoint(checkpoint, device)
        except CorruptCheckpoint as err:
            raise ValueError(" ".join(str(err).split())) from None  # our own message: whole, its advice is last
        except FileNotFoundError:
            raise ValueError(f"{checkpoint} was deleted while it was read (a live run keeps its newest "
                             "train.keep_checkpoints): pass the run directory for its newest checkpoint, or a copy "
                             "of the file") from None
        except OSError as err:
            raise ValueError(f"could not read {checkpoint}: {_one_line(err)}") from None
    model = model_from_state(state, checkpoint)
    return model.to(device), checkpoint, trained_tokenizer(state)


def trained_tokenizer(state: dict) -> dict | None:
    """Whose token ids the checkpoint's model read, as its run recorded them from the corpus's manifest
    (``data.shards.corpus_tokenizer``; None: GPT-2's). A checkpoint from before that record: t5-base's for
    data=c4 (the only corpus of other tokens then), GPT-2's otherwise."""
    if "tokenizer" in state:
        return state["tokenizer"]
    if (state["config"].get("data") or {}).get("name") == "c4":
        return {"name": C4_TOKENIZER, "fingerprint": None}
    return None


def newest_checkpoint(run_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The run's newest loadable checkpoint (``latest_checkpoint``), read again from the newer one where the run,
    still training, deleted it between listing and reading it: it had written a newer one."""
    for _ in range(LIVE_RUN_READS):
        try:
            return latest_checkpoint(run_dir, device)
        except CheckpointReadError as err:
            if not isinstance(err.__cause__, FileNotFoundError):  # a fault of the file system, not the run's pruning
                raise
    raise ValueError(f"the run in {run_dir} deleted its newest checkpoint while it was read, {LIVE_RUN_READS} times "
                     "(each time writing a newer one: a live run keeps its newest train.keep_checkpoints): try "
                     "again, or pass a copy of one of its checkpoints/ckpt_*.pt files")


def checkpoint_source(checkpoint: Path) -> dict:
    """Where a model came from, for what is made of it (an export): the checkpoint file, its step (from its name;
    None for a file renamed by hand) and the launches of its run that trained it (train.py's ``launch`` records,
    each with its git commit and the patch of any uncommitted change: those that started before that step)."""
    checkpoint = Path(checkpoint).resolve()
    step = checkpoint_step(checkpoint) if CHECKPOINT_NAME.fullmatch(checkpoint.name) else None
    run_dir = checkpoint.parent.parent  # <run>/checkpoints/ckpt_<step>.pt
    launches = [] if step is None else [
        {"step": record["step"], **record["launch"]} for record in read_metrics(run_dir)
        if "launch" in record and record["step"] < step]
    return {"checkpoint": str(checkpoint), "step": step, "run_dir": str(run_dir), "launches": launches}


def model_from_state(state, checkpoint: Path) -> nn.Module:
    """The model (model.GPT or model.Llama) whose weights and model config a loaded train.py checkpoint holds."""
    if not (isinstance(state, dict) and isinstance(state.get("model"), dict)
            and isinstance(state.get("config"), dict) and isinstance(state["config"].get("model"), dict)):
        raise ValueError(f"{checkpoint} is not a checkpoint written by train.py: it lacks the model's weights "
                         "(\"model\") or its config (\"config\" with a \"model\" section)")
    try:
        model = build_model(model_config(state["config"]["model"]))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{checkpoint}: its model config does not make a model ({_one_line(err)})") from None
    try:
        # An averaging optimizer's run keeps the weights it evaluates at beside its training weights.
        model.load_state_dict(state.get("eval_model", state["model"]))
    except RuntimeError as err:
        raise ValueError(f"{checkpoint}: its weights do not fit the model of its own config ({_one_line(err)})") from None
    return model.eval()


def _one_line(err: Exception, limit: int = 300, with_type: bool = True) -> str:
    message = " ".join(str(err).split())
    text = f"{type(err).__name__}: {message}" if message and with_type else message or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
