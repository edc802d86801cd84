"""The training loop both networks share: `Trainer` owns the flow, subclasses fill hooks.

`moses_rnn.training.train.PairTrainer` (the RNN Encoder-Decoder on phrase pairs) and
`cslm.train.NgramTrainer` (the CSLM on n-grams) differ in their data, model,
objective, held-out measure and model directory; everything else is here,
written once:

- run-time set-up (`mtcommon.runtime`): device, CPU threads (tuned online
  unless fixed), bfloat16 autocast with float32 master weights, and
  data-parallel training under torchrun (DistributedDataParallel, gloo on CPU,
  NCCL on GPU; each rank takes its share of every global batch);
- exact resume: the model, the optimiser and the loop's counters go into
  `checkpoint.pt` atomically (rank 0 writes), and the batch of step s is a
  function of the seed and s alone, so a resumed run replays the batches the
  interrupted one would have seen;
- held-out perplexity every `eval_every` steps, the best weights kept,
  optional early stopping after `patience` evaluations without improvement;
- the `max_steps` / `max_minutes` limits, a progress bar with the moving
  average of the loss, and a JSON-ready summary with `<unit>_seen` and
  `train_seconds` (time in training steps only, without start-up and
  evaluation), so any script can compute the training rate.

Contract of the loss: the objective's forward returns the *sum* of the
negative log-likelihood over this rank's rows of the batch (plus any penalty
summed the same way); the loop divides by the global batch's rows and
multiplies by the number of ranks, so DDP's gradient average is exactly the
gradient of the global batch's mean loss (Eq. 4 of Cho et al. 2014 for the
phrase pairs).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict

import torch
from tqdm import tqdm

from . import modeldir
from .runtime import Distributed, Stopwatch, ThreadTuner, amp_dtype, autocast, choose_threads, resolve_device

# Fields of a training config that a resumed run takes from the command line
# rather than from the checkpoint: they say how long and where to run, not what.
RUN_CONTROL = ("max_steps", "max_minutes", "max_epochs", "device", "threads", "dtype")


def apply_recipe(cfg, recipes: dict[str, dict]) -> None:
    """Fill the fields of a training config left None with its recipe's values (`cfg.recipe`)."""
    if cfg.recipe not in recipes:
        raise ValueError(f"unknown recipe {cfg.recipe!r}; choose from {', '.join(recipes)}")
    for name, value in recipes[cfg.recipe].items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)


class Trainer:
    """Train (or resume) one model into `model_dir`; `run()` returns the summary.

    Subclasses set `unit` ("pairs", "ngrams") and implement the hooks below.
    After `prepare`, they must have set `self.max_steps`, `self.eval_every` and
    `self.patience` (None: no early stopping).
    """

    unit = "examples"

    def __init__(self, data: str, model_dir: str, cfg, resume: bool = False, progress: bool = True,
                 trace: bool = False):
        """`data`: the training data's path (a phrase table, a text corpus); `trace`: keep every step's loss."""
        self.data, self.model_dir, self.progress, self.trace = data, model_dir, progress, trace
        self.dist = Distributed.from_env()
        self.state = None
        if resume:
            self.state = modeldir.load_checkpoint(model_dir)
            try:
                saved = type(cfg)(**self.state["train_config"])
            except (TypeError, ValueError) as e:  # unknown fields, an unknown recipe
                raise modeldir.ModelError(os.path.join(model_dir, modeldir.CHECKPOINT),
                                          f"its train_config does not fit this version ({e})") from None
            for name in RUN_CONTROL:
                if hasattr(cfg, name):
                    setattr(saved, name, getattr(cfg, name))
            cfg = saved
        self.cfg = cfg
        self.resumed = resume
        self.device = self.dist.start(resolve_device(cfg.device))
        self.amp = amp_dtype(self.device, getattr(cfg, "dtype", "fp32"))
        if self.dist.is_main:
            os.makedirs(model_dir, exist_ok=True)

    # ---- hooks ------------------------------------------------------------

    def prepare(self) -> None:
        """Read the data, build or load vocabularies and the model config (resumed: `self.resumed`)."""
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        """The model with its initial weights (the paper's initialisation), on the CPU."""
        raise NotImplementedError

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def build_objective(self, model: torch.nn.Module) -> torch.nn.Module:
        """A module whose forward(*batch) is the summed loss of this rank's rows (see the module doc)."""
        raise NotImplementedError

    def batch(self, step: int) -> tuple[tuple, int]:
        """(this rank's share of the batch of step `step`, as objective arguments on the device;
        the number of rows of the whole global batch)."""
        raise NotImplementedError

    def heldout(self, model: torch.nn.Module) -> tuple[float, int]:
        """(summed negative natural-log likelihood, tokens) of this rank's share of the held-out set."""
        raise NotImplementedError

    def save_best(self, model: torch.nn.Module, meta: dict) -> None:
        """Write the model directory's weights and config (rank 0 only calls this)."""
        raise NotImplementedError

    def big_model(self) -> bool:
        """Whether the model is large enough (the `small` preset and up) to use several CPU threads."""
        return True

    def describe(self) -> dict:
        """Numbers about the data for the summary and the saved metadata."""
        return {}

    # ---- the flow ---------------------------------------------------------

    def evaluate(self, model: torch.nn.Module) -> float:
        model.eval()
        with torch.no_grad():
            nll, tokens = self.heldout(model)
        model.train()
        nll, tokens = self.dist.all_sum([nll, tokens], self.device)
        return math.exp(nll / max(tokens, 1))

    def run(self) -> dict:
        """Train to the end (steps, minutes or patience), leave the process group, return the summary."""
        try:
            return self._run()
        finally:
            self.dist.stop()

    def _run(self) -> dict:
        cfg, dist = self.cfg, self.dist
        self.prepare()
        tuner = ThreadTuner(self.device, choose_threads(self.device, cfg.threads, self.big_model(), dist.local_world))
        torch.manual_seed(cfg.seed)
        if self.state is None:
            model = self.build_model()
        else:  # the checkpoint's weights, checked against the model's config
            model = modeldir.fit_state(os.path.join(self.model_dir, modeldir.CHECKPOINT), self.build_model,
                                       self.state["model"])
        model.to(self.device).train()
        optimizer = self.build_optimizer(model)
        loop = {"step": 0, "best_valid_ppl": math.inf, "since_best": 0, "history": [], "train_seconds": 0.0,
                "examples_seen": 0, "saved": False}
        if self.state is not None:
            optimizer.load_state_dict(self.state["optimizer"])
            loop.update(self.state["loop"])
        objective = self.build_objective(model)
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            objective = DistributedDataParallel(objective, device_ids=[self.device.index] if
                                                self.device.type == "cuda" else None)
        params = [p for p in model.parameters() if p.requires_grad]
        clip = getattr(cfg, "clip", None)
        meta = {**self.describe(), "train_config": asdict(cfg)}

        def record(ppl: float) -> None:
            loop["history"].append({"step": loop["step"], "train_seconds": watch.seconds,
                                    "examples_seen": loop["examples_seen"], "valid_ppl": ppl})

        def checkpoint(ppl: float) -> None:
            if ppl < loop["best_valid_ppl"] or not loop["saved"]:
                loop["best_valid_ppl"], loop["since_best"], loop["saved"] = min(loop["best_valid_ppl"], ppl), 0, True
                if dist.is_main:
                    self.save_best(model, {**meta, "step": loop["step"], "valid_ppl": ppl})
            else:
                loop["since_best"] += 1
            self.write_checkpoint(model, optimizer, loop)

        start = time.perf_counter()
        run_start_step, run_start_seconds, run_start_seen = loop["step"], loop["train_seconds"], loop["examples_seen"]
        watch = Stopwatch(loop["train_seconds"])
        bar = tqdm(total=self.max_steps, initial=loop["step"], unit="step", dynamic_ncols=True,
                   disable=not (self.progress and dist.is_main))
        ppl, loss_ema, evaluated_at, stopped = math.nan, None, None, "max_steps"
        trace: list[float] = []
        while loop["step"] < self.max_steps:
            if self.patience is not None and loop["since_best"] >= self.patience:
                stopped = "patience"
                break
            over = cfg.max_minutes is not None and time.perf_counter() - start > 60 * cfg.max_minutes
            if dist.enabled:  # every rank must stop at the same step
                over = dist.all_sum([float(over)], self.device)[0] > 0
            if over:
                stopped = "max_minutes"
                break
            step = loop["step"]
            tuner.before_step(step)
            t0 = time.perf_counter()
            with watch:
                args, rows = self.batch(step)
                with autocast(self.device, self.amp):
                    total = objective(*args)
                loss = total * (dist.world / rows)  # the global batch's mean loss, once DDP averages
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                value = loss.item()
            tuner.after_step(time.perf_counter() - t0)
            if dist.enabled:
                value = dist.all_sum([value], self.device)[0] / dist.world
            if self.trace:
                trace.append(value)
            loop["step"] += 1
            loop["examples_seen"] += rows
            loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
            if loop["step"] % self.eval_every == 0 or loop["step"] == self.max_steps:
                ppl, evaluated_at = self.evaluate(model), loop["step"]
                record(ppl)
                loop["train_seconds"] = watch.seconds
                checkpoint(ppl)
            rate = (loop["examples_seen"] - run_start_seen) / max(watch.seconds - run_start_seconds, 1e-9)
            bar.set_postfix(loss=f"{loss_ema:.3f}", valid_ppl=f"{ppl:.2f}", **{f"{self.unit}_s": f"{rate:.0f}"},
                            refresh=False)
            bar.update(1)
        bar.close()
        loop["train_seconds"] = watch.seconds
        if evaluated_at != loop["step"] and stopped != "patience":  # stopped by the clock, or nothing to do
            ppl = self.evaluate(model)
            if loop["step"] > run_start_step:
                record(ppl)
            checkpoint(ppl)
        dist.barrier()
        summary = {
            **self.describe(),
            "stopped": stopped,
            "steps": loop["step"],
            f"{self.unit}_seen": loop["examples_seen"] - run_start_seen,
            "train_seconds": round(watch.seconds - run_start_seconds, 3),
            "seconds": round(time.perf_counter() - start, 3),
            "valid_ppl": ppl,
            "best_valid_ppl": loop["best_valid_ppl"],
            "valid_ppl_history": loop["history"],
            "parameters": modeldir.parameter_count(model),
            "dtype": "bf16" if self.amp == torch.bfloat16 else "fp32",
            "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
            "processes": dist.world,
            "rank": dist.rank,
        }
        if self.trace:
            summary["loss_trace"] = trace
        return summary

    def write_checkpoint(self, model, optimizer, loop: dict) -> None:
        if self.dist.is_main:
            modeldir.save_checkpoint(self.model_dir, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loop": dict(loop),
                "train_config": asdict(self.cfg),
            })
