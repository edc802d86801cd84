"""Where and how the arithmetic runs: device, CPU threads, precision, processes.

One policy for every tool of the project (training, table scoring, the CSLM
engine and server, the benchmarks):

- `resolve_device("auto")` is the first CUDA device when torch sees one, else
  the CPU.
- `configure_threads` sets torch's intra-op threads once, by model size.
  `ThreadTuner` goes further for long CPU runs: it times steps at each
  candidate thread count now and then and keeps the fastest, so a neighbour
  process that takes a core (a Moses build, MERT) makes training fall back to
  fewer threads instead of waiting on a descheduled one (more threads never
  slower than fewer).
- `amp_dtype` checks and resolves `--dtype` (bfloat16 autocast with float32
  master weights, or float32); `probe_dtype` settles `--dtype auto`: on a CPU
  with native bfloat16 arithmetic (AVX-512 BF16 or AMX) by timing the
  caller's own work in each dtype and keeping the faster, on a GPU bfloat16
  where native, elsewhere float32.
- `Distributed` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and
  starts the process group: gloo on CPU, NCCL on GPU.
- `upload` and `download` move a call's arrays to the device and its result
  back: on a GPU through pinned memory, queued without waiting, so that a
  call waits for the GPU once, for its result.
- `exit_with_parent` makes a helper process (a scoring worker) die with the
  process that started it, however that one ends (kill -9 included).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .errors import UserError


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def check_device(name: str) -> str:
    """`name` if it is a device name the tools take (DEVICE_NAMES), else a UserError."""
    kind, colon, index = name.partition(":")
    if not (name in ("auto", "cpu", "cuda") or (kind == "cuda" and colon and index.isdigit())):
        raise UserError(f"{name!r} is not a device: choose {DEVICE_NAMES}")
    return name


def resolve_device(name: str) -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> a torch.device that exists here (else a UserError)."""
    if check_device(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but torch sees no CUDA device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"--device {name} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return dev


def upload(arrays: Sequence[np.ndarray], device: torch.device, dtype=np.int64) -> list[torch.Tensor]:
    """Host arrays as tensors of `dtype` (int64: ids and positions) on `device`, views of one transfer. On
    CUDA the copy is staged in pinned memory and queued without waiting: a copy from pageable memory first
    waits for every kernel already launched, so that the host could not prepare the next step while the GPU
    computes. On the CPU no copy is made of a single array of `dtype`."""
    if len(arrays) == 1:
        flat = np.ascontiguousarray(arrays[0], dtype).reshape(-1)
    else:
        flat = np.concatenate([np.asarray(a, dtype).reshape(-1) for a in arrays])
    t = torch.from_numpy(flat)
    if device.type == "cuda":
        t = t.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        t = t.to(device)
    views, at = [], 0
    for a in arrays:
        size = int(np.prod(np.shape(a), dtype=np.int64))
        views.append(t[at : at + size].view(np.shape(a)))
        at += size
    return views


def download(t: torch.Tensor) -> np.ndarray:
    """A tensor's values on the host, as a numpy array. From CUDA through pinned memory, after the one wait for
    the work queued before it; on the CPU without a copy."""
    t = t.detach()
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return host.numpy()
    return t.cpu().numpy()


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: The hidden width of the `small` presets (the RNN's GRU units, the CSLM's widest layer).
SMALL_WIDTH = 256


def is_big(config) -> bool:
    """Whether a model is of the `small` preset's size or larger, by its config's `hidden` (an int, or
    the CSLM's layer widths); without a config, yes. A big model's ops are large enough to split over
    CPU threads; a smaller one runs on one thread and, for table scoring, in one process per core."""
    hidden = getattr(config, "hidden", None)
    if hidden is None:
        return True
    return max(hidden if isinstance(hidden, (tuple, list)) else (hidden,)) >= SMALL_WIDTH


def omp_threads() -> int | None:
    """OMP_NUM_THREADS as a thread count, or None when unset or empty; another value is an error."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value:
        return None
    # OpenMP allows a list ("4,2": per nesting level); the first level is torch's intra-op threads
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise UserError(f"OMP_NUM_THREADS={value}: not a positive thread count")
    return int(first)


def configure_threads(device: torch.device, threads: int | None = None, config=None) -> int:
    """Set torch's intra-op threads for CPU work and return the number used.

    Default: OMP_NUM_THREADS when it is set (as for every OpenMP program: a
    scheduler or a make recipe that runs several jobs on one machine sets it),
    else every core for models of the `small` preset's size and up. For
    smaller models one op is too short to split, and idle intra-op threads
    spin against the gzip threads and other processes: one thread is faster.
    Jobs that together ask for more threads than there are cores wait on
    each other's spinning threads: two 2-thread rescorings on 2 cores run
    7.5 times slower than two 1-thread ones (docs/pipeline.md, `NET_THREADS`).
    """
    if device.type != "cpu":
        return torch.get_num_threads()
    if threads is None:
        threads = omp_threads() or (cpu_count() if is_big(config) else 1)
    if threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    return threads


def choose_threads(device: torch.device, threads: int | None, big: bool = True, local_world: int = 1) -> int | None:
    """The fixed CPU thread count for a training run, or None to let `ThreadTuner` choose.

    A count given by the user, or in OMP_NUM_THREADS, is kept. Models smaller
    than `small` (not `big`) run on one thread (see `configure_threads`);
    under torchrun the ranks of a machine share its cores evenly. Otherwise
    the count is tuned while training runs.
    """
    if device.type != "cpu" or threads is not None:
        return threads
    if local_world > 1:  # torchrun sets OMP_NUM_THREADS=1 for its ranks unless told: the cores are shared instead
        return max(1, cpu_count() // local_world) if big else 1
    return omp_threads() or (None if big else 1)


def cpu_has_bf16() -> bool:
    """True when this CPU does bfloat16 arithmetic natively (AVX-512 BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 natively: a GPU of compute capability 8.0 or later, a CPU
    with AVX-512 BF16 or AMX (`cpu_has_bf16`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    return cpu_has_bf16()


def amp_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype | None:
    """The autocast dtype for `dtype` ('auto', 'bf16', 'fp32') on `device`; None means float32.

    'bf16' where the hardware has no native bfloat16 (`native_bf16`) is a
    UserError. 'auto' here is the rule without timing, bfloat16 where native,
    else float32: what `probe_dtype` keeps on GPUs and refines on CPUs.
    """
    if dtype == "fp32":
        return None
    native = native_bf16(device)
    if dtype == "bf16":
        if not native:
            raise UserError("--dtype bf16 asked for, but this CPU has no native bfloat16 (AVX-512 BF16 or AMX)"
                            if device.type == "cpu" else
                            "--dtype bf16 asked for, but this GPU has no native bfloat16 (compute capability 8.0 "
                            "or later)")
        return torch.bfloat16
    if dtype != "auto":
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, bf16 or fp32")
    return torch.bfloat16 if native else None


def dtype_name(amp: torch.dtype | None) -> str:
    """'bf16' or 'fp32': the `--dtype` value that gives the autocast dtype `amp` (None: float32)."""
    return "bf16" if amp == torch.bfloat16 else "fp32"


def probe_dtype(device: torch.device, dtype: str, step: Callable[[torch.dtype | None], object], *,
                what: str = "a step", quiet: bool = False, combine: Callable[[list[float]], list[float]] | None = None,
                repeats: int = 5, budget: float = 2.0, clock: Callable[[], float] = time.perf_counter
                ) -> torch.dtype | None:
    """The autocast dtype to run with (None: float32), settling 'auto' by timing the caller's own work.

    `step(amp)` does one representative piece of the run's work (a training
    step's forward and backward pass, the scoring of a block of pairs) under
    autocast dtype `amp` and must leave no trace in the run (no weight
    update, no random numbers drawn). 'fp32' and 'bf16' are `amp_dtype`'s,
    untimed. 'auto' on a CPU with native bfloat16: `step` is called once per
    dtype to warm up (oneDNN builds its kernels, the bfloat16 copies are
    made), then in interleaved rounds, up to `repeats` of them while the
    rounds fit in `budget` seconds (always at least one), and the dtype with
    the lower median time is kept, float32 on a tie. On a CPU without native
    bfloat16 'auto' is float32, untimed: emulated bfloat16 arithmetic is
    several times slower. Under torchrun, `combine` sums the two medians over
    the processes (every process calls it, a process without native
    bfloat16 with float32 infinitely faster), so all of them choose alike.
    Unless `quiet`, the choice and both times go to stderr in one line.
    """
    # a GPU keeps the rule without timing: its kernels run asynchronously, so a short host-side timing
    # measures launch queues rather than arithmetic, and a GPU with native bfloat16 does its matrix
    # products at twice the float32 rate or more
    if dtype != "auto" or device.type != "cpu":
        return amp_dtype(device, dtype)
    candidates = (None, torch.bfloat16)
    native = cpu_has_bf16()
    if native:
        times: dict = {amp: [] for amp in candidates}
        start = clock()
        for amp in candidates:  # warm-up, untimed
            step(amp)
        for round_ in range(repeats):
            began = clock()
            for amp in candidates if round_ % 2 == 0 else candidates[::-1]:  # alternate who goes first
                t = clock()
                step(amp)
                times[amp].append(clock() - t)
            now = clock()
            if now - start + (now - began) > budget:  # another round would overrun the budget
                break
        medians = [statistics.median(times[amp]) for amp in candidates]
    else:
        medians = [0.0, math.inf]
    if combine is not None:
        medians = combine(medians)
    chosen = candidates[medians.index(min(medians))]  # the first, float32, on a tie
    if native and not quiet:
        print(f"--dtype auto: {dtype_name(chosen)}, the faster here ({what}: "
              + ", ".join(f"{dtype_name(amp)} {1e3 * statistics.median(times[amp]):.1f} ms" for amp in candidates)
              + f", medians of {len(times[None])}{'; chosen over all processes' if combine else ''})",
              file=sys.stderr, flush=True)
    return chosen


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed-precision context for the forward pass (a no-op for float32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class ThreadTuner:
    """Chooses the CPU intra-op thread count by timing real training steps.

    Every `period` steps it runs `trial` steps at each candidate count (1, 2,
    4, ... up to the cores it may use), compares the median step times and
    keeps the fastest. The first trial starts after `warmup` steps; a new one
    starts at once when the median of the last 8 steps grows to `slowdown`
    times the chosen count's trial median (a neighbour took a core). With a
    fixed `threads` or on a GPU it does nothing.

    Use: `tuner.before_step(step)` sets the count for that step;
    `tuner.after_step(seconds)` records how long the step took.
    """

    def __init__(self, device: torch.device, threads: int | None, period: int = 2000, trial: int = 6,
                 warmup: int = 5, cores: int | None = None, slowdown: float = 1.6):
        cores = cores or cpu_count()
        self.active = device.type == "cpu" and threads is None and cores > 1
        counts, c = [], 1
        while c < cores:
            counts.append(c)
            c *= 2
        self.candidates = counts + [cores]
        self.current = threads or cores
        self.period, self.trial, self.warmup = period, trial, warmup
        self._plan: list[int] = []  # thread counts of the steps of the trial under way
        self._times: dict[int, list[float]] = {}
        self._step_threads, self._step = self.current, 0
        self.decisions: list[tuple[int, int]] = []  # (step, threads chosen)
        self.slowdown, self._chosen_time, self._recent = slowdown, None, collections.deque(maxlen=8)
        self._retrial = False
        if device.type == "cpu":
            torch.set_num_threads(self.current)

    def before_step(self, step: int) -> None:
        if not self.active:
            return
        due = step >= self.warmup and (step - self.warmup) % self.period == 0
        if not self._plan and (due or self._retrial):
            self._retrial = False
            # interleave the candidates so that a change of load hits all of them alike
            self._plan = [c for _ in range(self.trial) for c in self.candidates]
            self._times = {c: [] for c in self.candidates}
        n = self._plan.pop(0) if self._plan else self.current
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        self._step_threads, self._step = n, step

    def after_step(self, seconds: float) -> None:
        if not self.active:
            return
        if not self._times:  # between trials: watch for a slowdown
            self._recent.append(seconds)
            if (self._chosen_time is not None and len(self._recent) == self._recent.maxlen
                    and statistics.median(self._recent) > self.slowdown * self._chosen_time):
                self._retrial = True
                self._recent.clear()
            return
        self._times[self._step_threads].append(seconds)
        if not self._plan:  # the trial is over: keep the fastest count
            med = {c: statistics.median(t) for c, t in self._times.items() if t}
            self.current = min(med, key=lambda c: (med[c], -c))
            self._chosen_time = med[self.current]
            self._recent.clear()
            torch.set_num_threads(self.current)
            self.decisions.append((self._step, self.current))
            self._times = {}


@dataclass
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 when run alone)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # the group `all_sum` adds up in: gloo over the host's memory, so that a sum never waits for the GPU's
    # queued kernels (on NCCL a separate gloo group of the same ranks; on CPU the default group, itself gloo)
    host_group: object = field(default=None, repr=False, compare=False)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def local_world(self) -> int:
        """Ranks on this machine (torchrun's LOCAL_WORLD_SIZE)."""
        return int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) if self.enabled else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "Distributed":
        """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK (absent: a single process)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        return cls(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))

    def start(self, device: torch.device) -> torch.device:
        """Join the process group (gloo on CPU, NCCL on CUDA); returns this rank's device.

        On CUDA each local rank takes its own GPU (cuda:LOCAL_RANK).
        """
        if not self.enabled:
            return device
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if dist.get_backend() != "gloo" and self.host_group is None:
            self.host_group = dist.new_group(backend="gloo")
        return device

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of host `values` over all ranks (the values themselves when alone), in
        `host_group`: on a GPU, NCCL would queue the sum behind every kernel queued so far, and reading it
        would make the host wait for them (the training loop calls this at every step)."""
        if not self.enabled:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.host_group)
        return t.tolist()

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def stop(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def exit_with_parent(parent: int, poll: float = 1.0, use_prctl: bool = True) -> None:
    """Make this process, a helper started by process `parent`, exit as soon as `parent` is gone.

    A worker of a process pool blocks on its task pipe, whose write end it holds itself: killed
    without clean-up (kill -9, the OOM killer, SIGHUP with no handler), the parent would leave it,
    and multiprocessing's resource tracker, which waits for every holder of its pipe to close it,
    running forever. On Linux the kernel sends this process SIGKILL when its parent dies
    (prctl PR_SET_PDEATHSIG; "parent" is the thread that started it, which for `WindowPool` is the
    thread that also shuts the pool down). Everywhere, a daemon thread checks os.getppid() every
    `poll` seconds and exits when the process has been handed to another parent. A parent already
    gone when this is called ends the process at once.
    """
    if use_prctl and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # died before the watch began
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class Stopwatch:
    """Accumulates the seconds spent inside `with watch:` blocks."""

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    def __enter__(self):
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t
        return False
