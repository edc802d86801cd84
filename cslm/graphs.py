"""A CSLM's scores on a GPU as CUDA graphs, replayed over fixed batch sizes.

On a GPU the network of a decoder's request is a few hundred microseconds of the host's work and a few dozen
of the GPU's: the engine's eager path de-duplicates the histories on the host, then dispatches a dozen
operations or more, each its own kernel launch, and stages every transfer through newly pinned memory. A
CUDA graph records the whole computation once per batch size and replays it with one launch.

`GraphScorer.score` takes (N, width) padded rows (the engine's `score_rows`), copies them into a pinned
staging buffer, and per part of at most the largest bucket:

    1. one copy of the part's rows to the device, into the static input of the smallest bucket that holds it
       (buckets: 64, 128, ..., `max_rows` rows; the rows past the part are left as they were, valid ids);
    2. one replay of that bucket's graph, for every row, with the functions the eager path calls:
       - self-normalised: o_w = out.weight[w] . h(history) + out.bias[w], h from the premultiplied first
         layer and the rectified layers after it (`CSLM.features_from_tables`, `CSLM.output_rows`; docs/cslm.md,
         "Self-normalised scoring");
       - exact: ln P(w | history) = o_w - ln sum_r exp(o_r), Eq. (2), from the whole output layer;
    3. one copy of the part's scores back to pinned memory;

and waits once for the last part. Deviations from the eager path: every row computes its own history (no
de-duplication: on a GPU the arithmetic of a repeated history costs less than the host's sorting), and a
row's scores are those of its bucket's batch size, equal to the eager path's within float rounding (the
matrix products' kernels may sum in another order for another size).

Without CUDA (`capture=False`) the same buckets run eagerly: the bucketing, staging and splitting are then
testable on a CPU.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from mtcommon.errors import UserError

# The smallest bucket: a lone n-gram's request pads to it (on a GPU 64 rows cost what one does).
MIN_ROWS = 64
# The largest bucket, whatever --max-batch says: a larger call is scored in parts of this many rows (the
# paper-size CSLM's exact scores hold 16,384 x 15,000 logits, about 1 GB, and as much again for ln Z).
MAX_ROWS = 1 << 14
# Rows staged on the host at a time: a call of more is scored in parts of this many, one wait each.
STAGING_ROWS = 1 << 18


def buckets(max_rows: int) -> list[int]:
    """The batch sizes with a graph of their own: powers of two from MIN_ROWS, and `max_rows` last."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    sizes, b = [], MIN_ROWS
    while b < max_rows:
        sizes.append(b)
        b *= 2
    return sizes + [max_rows]


class GraphScorer:
    """`score(rows)` -> the score of each padded row (o_w, or exact ln P), for one model on one device (module
    docstring). One call at a time (a lock keeps it so): the staging buffers and the graphs' inputs are shared."""

    def __init__(self, model, tables: torch.Tensor | None, device: torch.device, max_rows: int = 8192,
                 capture: bool | None = None, name: str = "the model"):
        """`model` a CSLM in eval mode on `device`; `tables` its `first_layer_tables` for self-normalised scores
        o_w, None for exact log-probabilities; `max_rows` the largest bucket (the server's --max-batch, at most
        MAX_ROWS); `capture` records CUDA graphs (None: when `device` is CUDA). A failed capture is a UserError
        naming the model."""
        self.model, self.tables, self.device = model, tables, torch.device(device)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.width = model.config.context + 1  # a row: the history (and a joint model's source window), the word
        self.sizes = buckets(min(max_rows, MAX_ROWS))
        pin = self.device.type == "cuda"
        # pinned host memory, written by numpy and read by the copies to and from the device; zeros are valid ids
        self._rows_host = torch.zeros((min(STAGING_ROWS, self.sizes[-1] * 32), self.width), dtype=torch.int64,
                                      pin_memory=pin)
        self._out_host = torch.zeros(len(self._rows_host), dtype=torch.float32, pin_memory=pin)
        self._inputs = {b: torch.zeros((b, self.width), dtype=torch.int64, device=self.device) for b in self.sizes}
        self._outputs: dict[int, torch.Tensor] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._lock = threading.Lock()
        try:
            with torch.no_grad():
                self._record()
        except RuntimeError as e:  # the CUDA runtime's refusal (out of memory included), in one line
            raise UserError(f"{name}: CUDA graphs of its scores could not be recorded on {self.device}: "
                            f"{str(e).splitlines()[0]} (--evaluator torch scores without them)") from None

    @property
    def normalized(self) -> bool:
        """Exact log-probabilities (True) or self-normalised o_w."""
        return self.tables is None

    def _forward(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, width) ids -> (B,) float32 scores of each row's last word given the ids before it."""
        if self.normalized:
            logits = self.model(rows[:, :-1]).float()  # (B, V) activations o
            log_z = torch.logsumexp(logits, dim=1)  # Eq. (2)'s normaliser ln sum_r exp(o_r)
            return logits.gather(1, rows[:, -1:])[:, 0] - log_z  # o_w - ln Z
        h = self.model.features_from_tables(self.tables, rows[:, :-1])  # premultiplied first layer, the layers after
        return self.model.output_rows(h, rows[:, -1])  # one output row each: o_w

    def _record(self) -> None:
        """Each bucket's graph, after a warm-up on a side stream as CUDA graphs require; without capture, nothing
        to record. Each keeps a memory pool of its own, so that any may be replayed after any other (together
        about twice the largest one's: for the paper-size CSLM's 8,192 rows some 0.5 GB self-normalised, 2 GB
        exact)."""
        if not self.capture:
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for b in self.sizes:
                for _ in range(2):
                    self._forward(self._inputs[b])
        torch.cuda.current_stream(self.device).wait_stream(side)
        for b in self.sizes:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._outputs[b] = self._forward(self._inputs[b])
            self._graphs[b] = graph
        torch.cuda.synchronize(self.device)

    def bucket(self, n: int) -> int:
        """The smallest batch size with a graph that holds `n` rows (1 <= n <= the largest)."""
        return self.sizes[int(np.searchsorted(self.sizes, n))]

    @torch.no_grad()
    def score(self, rows: np.ndarray) -> np.ndarray:
        """(N, width) padded, valid ids (`Engine.score_rows`'s rows) -> (N,) float32 scores."""
        if rows.ndim != 2 or rows.shape[1] != self.width:
            raise ValueError(f"rows must be an (N, {self.width}) array, got shape {rows.shape}")
        out = np.empty(len(rows), np.float32)
        staged = len(self._rows_host)
        with self._lock:
            for start in range(0, len(rows), staged):
                part = rows[start : start + staged]
                out[start : start + len(part)] = self._score_staged(part)
        return out

    def _score_staged(self, rows: np.ndarray) -> np.ndarray:
        """`score` of at most the staging buffer's rows: one copy in, a replay and one copy out per bucketful,
        one wait at the end."""
        host_rows, host_out = self._rows_host.numpy(), self._out_host.numpy()
        host_rows[: len(rows)] = rows
        top = self.sizes[-1]
        for at in range(0, len(rows), top):
            n = min(top, len(rows) - at)
            b = self.bucket(n)
            static_in = self._inputs[b]
            static_in[:n].copy_(self._rows_host[at : at + n], non_blocking=True)
            if self.capture:
                self._graphs[b].replay()
                result = self._outputs[b]
            else:
                result = self._forward(static_in)
            self._out_host[at : at + n].copy_(result[:n], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return host_out[: len(rows)].copy()
