"""Every window of a run drawn as the MARS authors' trainers draw theirs (``data.draws=authors``).

Their trainers (AGI-Arena/MARS at 4831e28: ``MARS/train_{mars,adamw,muon}.py``, ``MARS/train_*_fw.py``,
``MARS_M/train_{mars_m,moonlight}*.py``) draw every window with ``torch.randint`` on each rank's global CPU
generator, seeded ``5000 + rank`` before the model is built (``MARS/train_mars.py:126``): the model's
initialisation draws first, and the windows continue from the generator state it leaves. Then, in this order:

- before the loop, the training batches drawn ahead: a whole step's ``gradient_accumulation_steps`` batches in
  the MARS and MARS-M trainers (``MARS/train_mars.py:275-280``; the exact scheme's look-ahead gradient reads
  them), one batch in the AdamW, Muon and Moonlight trainers (``MARS/train_adamw.py:263``);
- at each step k, first, when k is a multiple of ``eval_interval``, the evaluation, on rank 0 alone:
  ``eval_iters`` batches of the train split, then ``eval_iters`` of the val split (``estimate_loss``,
  ``MARS/train_mars.py:235-248``, called at 294-295); then the training batches that replace those step k
  reads (``MARS/train_mars.py:338-343``; ``MARS/train_adamw.py:317-327``, one after each micro-batch).

So training batch i (``step * grad_accum_steps + micro_step``) is drawn before the loop when i < ``ahead``,
and otherwise at step ``(i - ahead) // grad_accum_steps``, after that step's evaluation. Each batch is
``batch_size`` offsets ``torch.randint(len(split) - block_size, (batch_size,))``, a window being the
``block_size + 1`` tokens from its offset. With ``data.sampling=random_shard`` (their FineWeb-Edu trainers,
``MARS/train_mars_fw.py:139-149``) each training batch first picks its shard with Python's ``random.choice``,
seeded ``5000 + rank``, and draws its offsets inside that shard; the val batches come from the first val shard.

The state (both generators, the count of batches drawn, those drawn and not yet trained on) travels in the
checkpoint, so a resumed run draws what the uninterrupted run draws. Their trainer reseeds on resume and
repeats its first windows: a difference of theirs that this does not copy.
"""
import random

import numpy as np
import torch


class AuthorsDraws:
    """One rank's windows, drawn in the authors' order; see the module docstring. ``seed`` is theirs, 5000 +
    rank; ``ahead``: the training batches their trainer draws before its first step."""

    def __init__(self, train, val, *, batch_size: int, block_size: int, grad_accum_steps: int, ahead: int,
                 eval_interval: int, seed: int, by_shard: bool) -> None:
        self.train, self.val = train, val
        self.batch_size, self.block_size = batch_size, block_size
        self.grad_accum_steps, self.ahead, self.eval_interval = grad_accum_steps, ahead, eval_interval
        self.by_shard = by_shard
        self.generator = torch.Generator().manual_seed(seed)
        self.shard_picker = random.Random(seed)
        self.drawn = 0  # training batches drawn so far
        self.pending: dict[int, np.ndarray] = {}  # {training batch index: window starts} drawn, not yet passed

    def start_after_model_init(self, generator_state: torch.Tensor) -> None:
        """Continue from the global generator's state after the model's initialisation (seeded as theirs), and
        draw the batches their loop draws before its first step."""
        self.generator.set_state(generator_state)
        self._draw_training_batches_through(self.ahead)

    def training_starts(self, step: int, micro_step: int) -> np.ndarray:
        """The window starts of training micro-batch ``(step, micro_step)``."""
        index = step * self.grad_accum_steps + micro_step
        self._draw_training_batches_through(index + 1)
        # The exact scheme reads step k + 1's batches (its look-ahead gradient) before step k's: keep those too.
        for passed in [i for i in self.pending if i < (step - 1) * self.grad_accum_steps]:
            del self.pending[passed]
        return self.pending[index]

    def evaluation_starts(self, step: int, eval_iters: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The window starts of the evaluation after ``step`` steps: ``eval_iters`` batches of the train split,
        then of the val split (rank 0's draws only: theirs evaluate on rank 0 alone).

        An evaluation their loop does not make (the last step, off the ``eval_interval`` grid) draws from copies
        of the generators, so the training windows after it stay theirs."""
        first_after = step * self.grad_accum_steps + self.ahead  # the first training batch drawn after it
        if self.drawn > first_after:
            raise RuntimeError(f"the evaluation at step {step} comes after training batch {self.drawn - 1} was "
                               "drawn: the trainer broke the authors' order of draws")
        self._draw_training_batches_through(first_after)
        generator, shard_picker = self.generator, self.shard_picker
        if step % self.eval_interval:
            generator = torch.Generator().set_state(self.generator.get_state())
            shard_picker = random.Random()
            shard_picker.setstate(self.shard_picker.getstate())
        train = [self._starts(self.train, self._training_shard(shard_picker), generator) for _ in range(eval_iters)]
        val = [self._starts(self.val, 0 if self.by_shard else None, generator) for _ in range(eval_iters)]
        return train, val

    def _draw_training_batches_through(self, count: int) -> None:
        while self.drawn < count:
            self.pending[self.drawn] = self._starts(self.train, self._training_shard(self.shard_picker),
                                                    self.generator)
            self.drawn += 1

    def _training_shard(self, shard_picker: random.Random) -> int | None:
        return shard_picker.choice(range(len(self.train.shards))) if self.by_shard else None

    def _starts(self, tokens, shard: int | None, generator: torch.Generator) -> np.ndarray:
        """``batch_size`` window starts in the split's stream, uniform over the split or over one shard."""
        if shard is None:
            begin, length = 0, len(tokens)
        else:
            begin, length = int(tokens.starts[shard]), len(tokens.shards[shard])
        offsets = torch.randint(length - self.block_size, (self.batch_size,), generator=generator)
        return begin + offsets.numpy()

    def state_dict(self, step: int) -> dict:
        """What a checkpoint after ``step`` steps keeps to draw on as the uninterrupted run would."""
        return {"generator": self.generator.get_state(), "shard_picker": self.shard_picker.getstate(),
                "drawn": self.drawn, "grad_accum_steps": self.grad_accum_steps, "ahead": self.ahead,
                "pending": {index: torch.from_numpy(starts) for index, starts in self.pending.items()
                            if index >= step * self.grad_accum_steps}}

    def load_state_dict(self, state: dict) -> None:
        if (state["grad_accum_steps"], state["ahead"]) != (self.grad_accum_steps, self.ahead):
            raise ValueError(
                f"the checkpoint's windows were drawn {state['grad_accum_steps']} micro-batches a step, "
                f"{state['ahead']} ahead; this run draws {self.grad_accum_steps}, {self.ahead} ahead: "
                "data.draws=authors continues the checkpoint's draws only with its processes, batch and optimizer")
        self.generator.set_state(state["generator"])
        self.shard_picker.setstate(state["shard_picker"])
        self.drawn = state["drawn"]
        self.pending = {index: starts.numpy() for index, starts in state["pending"].items()}
