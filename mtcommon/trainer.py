"""The training loop both networks share: `Trainer` owns the flow, subclasses fill hooks.

`moses_rnn.training.train.PairTrainer` (the RNN Encoder-Decoder on phrase pairs) and
`cslm.train.NgramTrainer` (the CSLM on n-grams) differ in their data, model,
objective, held-out measure and model directory; everything else is here,
written once:

- run-time set-up (`mtcommon.runtime`): device, CPU threads (tuned online
  unless fixed), bfloat16 autocast with float32 master weights (`--dtype
  auto`: the faster of the two on this run's first batch, `_choose_dtype`), and
  data-parallel training under torchrun (DistributedDataParallel, gloo on CPU,
  NCCL on GPU; each rank takes its share of every global batch);
- exact resume: the model, the optimiser and the loop's counters go into
  `checkpoint.pt` atomically (rank 0 writes), and the batch of step s is a
  function of the seed and s alone, so a resumed run replays the batches the
  interrupted one would have seen;
- held-out perplexity every `eval_every` steps, the best weights kept,
  optional early stopping after `patience` evaluations without improvement;
- one model directory, one run: a directory that holds a model is continued
  (`resume`: on the data it trained on, with the options it was started with,
  as `mtcommon.checkpoint` rules) or replaced (`overwrite`), never
  overwritten unasked;
- the `max_steps` / `max_minutes` limits, both over the whole training (a
  resumed run gets what an interrupted one left), and the learning-rate
  schedule over them (`lr_factor`: constant, as the papers train, or decaying
  to 0 at whichever limit the run reaches first), a progress bar with the moving
  average of the loss, and a JSON-ready summary with `<unit>_seen` and
  `train_seconds` (time in training steps only, without start-up and
  evaluation), so any script can compute the training rate.

Each hook's contract is in its docstring.
"""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from . import modeldir
from .checkpoint import Checkpoint, Evaluation, LoopState, fingerprints, resumed_config
from .errors import UserError
from .runtime import (Distributed, Stopwatch, ThreadTuner, amp_dtype, autocast, choose_threads, dtype_name,
                      probe_dtype, resolve_device)

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(schedule: str, progress: float) -> float:
    """The learning rate's multiplier after `progress` (0..1) of the training budget.

    constant: 1 throughout (the papers' recipes). linear: 1 - progress. cosine: (1 + cos(pi progress)) / 2
    (Loshchilov & Hutter 2017, without restarts). Both decays reach 0 at the end of the budget, where a
    constant rate still takes full steps: a run cut off by its budget ends on smaller, averaging updates."""
    p = min(max(progress, 0.0), 1.0)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - p
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    raise UserError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, not {schedule!r}")


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam (Kingma & Ba 2015) over `params`, fused where this torch has the kernel for their device: one
    pass over each tensor instead of about ten element-wise ones, the same update up to float rounding
    (1.5e-8 after five steps of the RNN `small` preset). Its step took 4.2 against 20.6 ms for that preset's
    3.9M parameters on one core (2-core Intel Xeon with AVX-512), a fifth of a training step."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # a device or build without the fused kernel
        return torch.optim.Adam(params, lr=lr)


def apply_recipe(cfg, recipes: dict[str, dict]) -> None:
    """Fill the fields of a training config left None with its recipe's values (`cfg.recipe`)."""
    if cfg.recipe not in recipes:
        raise ValueError(f"unknown recipe {cfg.recipe!r}; choose from {', '.join(recipes)}")
    for name, value in recipes[cfg.recipe].items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)


@dataclass
class Schedule:
    """How long the loop runs and how often it evaluates: what `Trainer.prepare` returns."""

    max_steps: int | None  # None: no limit on steps (max_minutes or patience ends the run)
    eval_every: int  # steps between held-out evaluations (each followed by a checkpoint)
    patience: int | None = None  # evaluations without improvement before stopping; None: no early stopping
    limit: str = "max_steps"  # the option max_steps comes from, what the summary's `stopped` says it reached


class Trainer(ABC):
    """Train (or resume) one model into `model_dir`; `run()` returns the summary.

    Subclasses set `unit` (what a row of a batch is: "pairs", "ngrams") and
    implement the abstract hooks; `run` calls them in this order: `prepare`,
    `big_model`, `build_model`, `build_optimizer`, `build_objective`,
    `describe`, then per step `batch`, per evaluation `heldout` and, on a new
    best, `save_best`.
    """

    unit: str = "examples"
    # config fields that name the training data (checked as the data is: `data_paths`), and those that name
    # other files the run reads (compared with the checkpoint's by their bytes, not their names)
    data_fields: tuple[str, ...] = ()
    path_fields: tuple[str, ...] = ()

    def __init__(self, data: str, model_dir: str, cfg, resume: bool = False, progress: bool = True,
                 trace: bool = False, given: frozenset[str] | set[str] | None = None, overwrite: bool = False):
        """`data`: the training data's path (a phrase table, a text corpus); `trace`: keep every step's loss.

        `given`: the config fields the caller set explicitly (a command line's options: `cliutil.explicit_options`).
        On resume, the run goes on with the checkpoint's config: the run-control fields among `given` replace
        the checkpoint's, and any other field of `given` that differs from the checkpoint's is refused in one
        line naming it. None: every run-control field is taken from `cfg`, and no other is compared. Either
        way the data must be the data the run trained on. Without `resume`, a `model_dir` that holds a model
        is refused unless `overwrite`, which removes it first."""
        self.data, self.model_dir, self.progress, self.trace = data, model_dir, progress, trace
        self.dist = Distributed.from_env()
        self.checkpoint: Checkpoint | None = None
        if resume and overwrite:
            raise UserError("give one of --resume (continue the run in the model directory) and --overwrite "
                            "(start afresh)")
        inputs = fingerprints(self.data_paths(cfg), cfg, self.path_fields)
        if resume:
            self.checkpoint = Checkpoint.load(model_dir)
            cfg, inputs = resumed_config(self.checkpoint, model_dir, cfg, inputs, given, self.data_paths(cfg),
                                         self.data_fields, self.path_fields)
        else:
            held = [name for name in (modeldir.CHECKPOINT, modeldir.CONFIG, modeldir.WEIGHTS)
                    if os.path.exists(os.path.join(model_dir, name))]
            if held and not overwrite:
                raise UserError(f"{model_dir} already holds a model ({held[0]}): give --resume to continue its "
                                f"training, or --overwrite to start afresh")
        self.check_config(cfg)
        self.cfg = cfg
        self.inputs = inputs
        self.resumed = resume
        self.device = self.dist.start(resolve_device(cfg.device))
        try:  # a dtype this device cannot do stops the run here, before the data is read
            amp_dtype(self.device, getattr(cfg, "dtype", "fp32"))
        except UserError as e:
            if resume:
                raise UserError(f"{e}; the run in {model_dir} computes in {cfg.dtype}: resume it with --dtype fp32 "
                                f"to go on in float32") from None
            raise
        self.made_dir = False  # this run made model_dir: a run that fails before writing to it removes it
        if self.dist.is_main:
            self.made_dir = not os.path.isdir(model_dir)
            os.makedirs(model_dir, exist_ok=True)
            if overwrite:  # the checkpoint first: a run stopped here leaves nothing to resume by mistake
                for name in (modeldir.CHECKPOINT, modeldir.CONFIG, modeldir.WEIGHTS):
                    try:
                        os.remove(os.path.join(model_dir, name))
                    except FileNotFoundError:
                        pass

    def data_paths(self, cfg) -> list[str]:
        """The files of the training data the run with config `cfg` reads: `data` unless a subclass says
        otherwise (the data named by a field of `data_fields`)."""
        return [self.data]

    def check_config(self, cfg) -> None:
        """Refuse (UserError) a config that cannot run, once the checkpoint's fields are merged in on
        resume, before anything is read or written."""

    # ---- hooks ------------------------------------------------------------

    @abstractmethod
    def prepare(self) -> Schedule:
        """Read the data, build (or, if `self.resumed`, load) the vocabularies and the model config;
        return how long to train and how often to evaluate. Called once, before any other hook."""

    @abstractmethod
    def big_model(self) -> bool:
        """Whether the model is large enough (the `small` preset and up) to use several CPU threads."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """The model with its initial weights (the paper's initialisation), on the CPU; also called
        on the meta device to check a checkpoint's shapes, so it must only build, not load."""

    @abstractmethod
    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """A fresh optimiser over `model`'s parameters (a resumed run then loads its state)."""

    @abstractmethod
    def build_objective(self, model: torch.nn.Module) -> torch.nn.Module:
        """A module whose forward(*batch) returns the *sum* of the negative log-likelihood over this
        rank's rows of the batch (plus any penalty summed the same way). The loop divides it by the
        global batch's rows and multiplies by the number of ranks, so DDP's gradient average is exactly
        the gradient of the global batch's mean loss (Eq. 4 of Cho et al. 2014 for the phrase pairs)."""

    @abstractmethod
    def describe(self) -> dict:
        """Numbers about the data (JSON values) for the summary and the saved metadata."""

    @abstractmethod
    def batch(self, step: int) -> tuple[tuple, int]:
        """(this rank's share of the batch of step `step`, as objective arguments on the device;
        the number of rows of the whole global batch). A pure function of the seed and `step`."""

    @abstractmethod
    def heldout(self, model: torch.nn.Module) -> tuple[float, int]:
        """(summed negative natural-log likelihood, tokens) of this rank's share of the held-out set;
        called in evaluation mode without gradients."""

    @abstractmethod
    def save_best(self, model: torch.nn.Module, meta: dict) -> None:
        """Write the model directory's weights and config (only rank 0 calls this)."""

    # ---- the flow ---------------------------------------------------------

    def evaluate(self, model: torch.nn.Module) -> float:
        model.eval()
        with torch.no_grad():
            nll, tokens = self.heldout(model)
        model.train()
        nll, tokens = self.dist.all_sum([nll, tokens])
        return math.exp(nll / max(tokens, 1))

    def _backward(self, objective, optimizer: torch.optim.Optimizer, args: tuple, rows: int,
                  amp: torch.dtype | None) -> torch.Tensor:
        """The global batch's mean loss over this rank's `args` under autocast dtype `amp` (None: float32),
        its gradients in the parameters (those of an earlier call dropped)."""
        with autocast(self.device, amp):
            total = objective(*args)
        loss = total * (self.dist.world / rows)  # the global batch's mean loss, once DDP averages
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    def _choose_dtype(self, objective, optimizer: torch.optim.Optimizer, first_batch) -> torch.dtype | None:
        """The run's autocast dtype (`runtime.probe_dtype`), and `cfg.dtype` set to its name, which
        checkpoint.pt keeps for a resumed run. For 'auto' on a CPU with native bfloat16 the probe times
        forward and backward passes of `objective` (not DDP's: no collective) over `first_batch()`, the run's
        first batch, with no optimiser step and the gradients dropped after, so the run is the one the
        chosen dtype given explicitly makes."""
        dist = self.dist
        combine = dist.all_sum if dist.enabled else None
        amp = probe_dtype(self.device, getattr(self.cfg, "dtype", "fp32"),
                          lambda amp: self._backward(objective, optimizer, *first_batch(), amp),
                          what="a training step", quiet=not (self.progress and dist.is_main), combine=combine)
        optimizer.zero_grad(set_to_none=True)
        if hasattr(self.cfg, "dtype"):
            self.cfg.dtype = dtype_name(amp)
        return amp

    def run(self) -> dict:
        """Train to the end (steps, minutes or patience), leave the process group, return the summary."""
        try:
            return self._run()
        except BaseException:
            if self.made_dir:  # bad data, say: leave no empty model folder behind
                try:
                    os.rmdir(self.model_dir)  # only if empty: what the run wrote stays
                except OSError:
                    pass
            raise
        finally:
            self.dist.stop()

    def _run(self) -> dict:
        cfg, dist = self.cfg, self.dist
        self.schedule = schedule = self.prepare()
        tuner = ThreadTuner(self.device, choose_threads(self.device, cfg.threads, self.big_model(), dist.local_world))
        torch.manual_seed(cfg.seed)
        if self.checkpoint is None:
            model = self.build_model()
        else:  # the checkpoint's weights, checked against the model's config
            model = modeldir.fit_state(os.path.join(self.model_dir, modeldir.CHECKPOINT), self.build_model,
                                       self.checkpoint.model)
        model.to(self.device).train()
        optimizer = self.build_optimizer(model)
        loop = LoopState()
        if self.checkpoint is not None:
            optimizer.load_state_dict(self.checkpoint.optimizer)
            loop = self.checkpoint.loop
        for group in optimizer.param_groups:  # the rate a schedule scales: as built, or as a resumed run's
            group.setdefault("initial_lr", group["lr"])  # optimiser state brings it back
        lr_schedule = getattr(cfg, "lr_schedule", "constant")  # checked by the training configs
        objective = self.build_objective(model)
        first: dict = {}  # the batch of the run's first step, fetched once for the dtype probe and that step

        def first_batch() -> tuple[tuple, int]:
            if loop.step not in first:
                first[loop.step] = self.batch(loop.step)
            return first[loop.step]

        self.amp = self._choose_dtype(objective, optimizer, first_batch)
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            objective = DistributedDataParallel(objective, device_ids=[self.device.index] if
                                                self.device.type == "cuda" else None)
        params = [p for p in model.parameters() if p.requires_grad]
        clip = getattr(cfg, "clip", None)
        meta = {**self.describe(), "train_config": asdict(cfg), "device": self.device.type}

        def record(ppl: float) -> None:
            loop.history.append(Evaluation(loop.step, watch.seconds, loop.examples_seen, ppl))

        def checkpoint(ppl: float) -> None:
            if ppl < loop.best_valid_ppl or not loop.saved:
                loop.best_valid_ppl, loop.since_best, loop.saved = min(loop.best_valid_ppl, ppl), 0, True
                if dist.is_main:
                    self.save_best(model, {**meta, "step": loop.step, "valid_ppl": ppl})
            else:
                loop.since_best += 1
            if dist.is_main:
                Checkpoint(model.state_dict(), optimizer.state_dict(), loop, asdict(self.cfg),
                           self.inputs).save(self.model_dir)

        start = time.perf_counter()
        run_start_step, run_start_seconds, run_start_seen = loop.step, loop.train_seconds, loop.examples_seen
        run_start_wall = loop.wall_seconds

        def wall() -> float:  # the whole training's wall-clock seconds, this run's included
            return run_start_wall + time.perf_counter() - start
        watch = Stopwatch(loop.train_seconds)
        bar = tqdm(total=schedule.max_steps, initial=loop.step, unit="step", dynamic_ncols=True,
                   disable=not (self.progress and dist.is_main))
        ppl, loss_ema, evaluated_at, stopped = math.nan, None, None, schedule.limit
        trace: list[float] = []
        pending: torch.Tensor | None = None  # the last step's loss, not read yet

        def settle() -> None:
            """Read the last step's loss into the trace and the running mean. Called once the next step is
            queued, so that on a GPU the host never waits for one step before queuing the next (reading a
            value waits for every kernel before it); the bar's loss lags one step."""
            nonlocal pending, loss_ema
            if pending is None:
                return
            value, pending = pending.item(), None
            if dist.enabled:
                value = dist.all_sum([value])[0] / dist.world
            if self.trace:
                trace.append(value)
            loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
        while schedule.max_steps is None or loop.step < schedule.max_steps:
            if schedule.patience is not None and loop.since_best >= schedule.patience:
                stopped = "patience"
                break
            # the share of the wall-clock budget spent; every rank must stop at the same step and, with a
            # schedule, step with the same rate: the ranks' mean share decides for all
            spent = 0.0 if cfg.max_minutes is None else \
                wall() / (60 * cfg.max_minutes) if cfg.max_minutes > 0 else math.inf
            if dist.enabled and cfg.max_minutes is not None:
                spent = dist.all_sum([spent])[0] / dist.world
            if cfg.max_minutes is not None and spent > 1.0:
                stopped = "max_minutes"
                break
            if lr_schedule != "constant":  # the budget is whichever limit the run reaches first
                done = loop.step / schedule.max_steps if schedule.max_steps else 0.0
                factor = lr_factor(lr_schedule, max(done, spent))
                for group in optimizer.param_groups:
                    group["lr"] = group["initial_lr"] * factor
            step = loop.step
            tuner.before_step(step)
            t0 = time.perf_counter()
            with watch:
                args, rows = first.pop(step) if step in first else self.batch(step)
                loss = self._backward(objective, optimizer, args, rows, self.amp)
                if clip:
                    torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                settle()  # the step before's loss, this step queued
                pending = loss.detach()
            tuner.after_step(time.perf_counter() - t0)
            loop.step += 1
            loop.examples_seen += rows
            if loop.step % schedule.eval_every == 0 or loop.step == schedule.max_steps:
                settle()
                ppl, evaluated_at = self.evaluate(model), loop.step
                record(ppl)
                loop.train_seconds, loop.wall_seconds = watch.seconds, wall()
                checkpoint(ppl)
            rate = (loop.examples_seen - run_start_seen) / max(watch.seconds - run_start_seconds, 1e-9)
            bar.set_postfix(loss="-" if loss_ema is None else f"{loss_ema:.3f}", valid_ppl=f"{ppl:.2f}",
                            **{f"{self.unit}_s": f"{rate:.0f}"}, refresh=False)
            bar.update(1)
        settle()
        bar.close()
        loop.train_seconds, loop.wall_seconds = watch.seconds, wall()
        if evaluated_at != loop.step and stopped != "patience":  # stopped by the clock, or nothing to do
            ppl = self.evaluate(model)
            if loop.step > run_start_step:
                record(ppl)
            checkpoint(ppl)
        dist.barrier()
        summary = {
            **self.describe(),
            "stopped": stopped,
            "steps": loop.step,
            f"{self.unit}_seen": loop.examples_seen - run_start_seen,
            "train_seconds": round(watch.seconds - run_start_seconds, 3),
            "seconds": round(time.perf_counter() - start, 3),
            "valid_ppl": ppl,
            "best_valid_ppl": loop.best_valid_ppl,
            "valid_ppl_history": [asdict(e) for e in loop.history],
            "parameters": modeldir.parameter_count(model),
            "dtype": dtype_name(self.amp),
            "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
            "processes": dist.world,
            "rank": dist.rank,
        }
        if self.trace:
            summary["loss_trace"] = trace
        return summary
