"""Generating target phrases from a trained model: sampling and beam search.

Both work on any architecture through the step interface of
`modelbase.PhraseModel`:

    ctx = model.context(src, mask)                  # once per source phrase
    state = model.start_state(ctx)                  # h'_0 (encdec) or s_0 (rnnsearch)
    logits, state = model.step(ctx, state, e_prev)  # p(y_t | y_<t, x) and the next state
    (beam search: model.step_readout, and the output layer a block of rows at a time)

where `e_prev` is the embedding of the previous word in
`model.target_embeddings()` (zeros before the first word, as in training).

Every source phrase of a call is decoded together in one batch (padded,
masked), so a file of phrases costs a few large matrix products per step.

- `sample`: N ancestral samples per phrase; distinct targets with their
  counts, ranked by the model's log-probability (Cho et al. 2014, Table 3).
- `beam_search`: the usual beam search; a hypothesis ends when it emits
  </s>; at most `max_len(source)` words; optional length normalisation
  (log p divided by the number of target symbols, </s> included, the same
  normalisation as `moses-rnn score --normalize`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from mtcommon.errors import UserError
from mtcommon.finite import check_finite
from mtcommon.vocab import EOS

from ..networks.modelbase import log_normalizer_
from ..networks.modelio import LoadedModel


@dataclass
class Hypothesis:
    words: list[str]
    log_prob: float  # natural log p(words </s> | source)
    score: float  # what the ranking used: log_prob, or log_prob per target symbol
    count: int = 1  # samples that drew this target (sampling only)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def max_words(src_len: int, ratio: float, extra: int) -> int:
    """The longest target allowed for a source of `src_len` words."""
    return max(1, int(math.floor(ratio * src_len)) + extra)


# `largest`: the columns of a row of logits are ranked in chunks of this many, by their maxima
TOP_CHUNK = 64


def largest(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n largest values of each row of x [R, V] and their columns, in no order: what
    `x.topk(n, sorted=False)` returns (up to which of equal values), in about half its time for an
    output layer's rows. The n largest of a row lie in the n chunks of TOP_CHUNK columns with the
    largest maxima (each of those n maxima is at least the row's n-th largest value), so only those
    chunks (and the last V mod TOP_CHUNK columns) are ranked."""
    R, V = x.shape
    whole = V // TOP_CHUNK * TOP_CHUNK
    if whole < 4 * n * TOP_CHUNK:  # too few chunks to leave out many
        return x.topk(n, dim=1, sorted=False)
    chunks = x[:, :whole].view(R, -1, TOP_CHUNK).amax(dim=2).topk(n, dim=1, sorted=False).indices  # [R, n]
    cols = (chunks[:, :, None] * TOP_CHUNK + torch.arange(TOP_CHUNK, device=x.device)).view(R, -1)
    if whole < V:
        cols = torch.cat([cols, torch.arange(whole, V, device=x.device).expand(R, -1)], 1)
    top, pick = x.gather(1, cols).topk(n, dim=1, sorted=False)
    return top, cols.gather(1, pick)


class Generator:
    logit_block_bytes = 1 << 24  # beam search's float32 logits per block of rows (16 MB, within the cache)

    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model.eval()
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        self.device = next(self.model.parameters()).device
        self.eos = self.tgt_vocab.index[EOS]
        self.unk = self.tgt_vocab.unk_id
        self.embed = self.model.target_embeddings()
        self.name = loaded.path  # the model directory, named by the error a non-finite score raises

    def _encode(self, sources: Sequence[str]):
        """Right-padded source ids and mask; the model's context; source lengths."""
        flat, lens = self.src_vocab.encode_phrases(sources)
        ids = np.split(flat, np.cumsum(lens)[:-1]) if len(sources) else []
        ids = [x.tolist() for x in ids]
        for i, s in enumerate(ids):
            if not s:
                raise UserError(f"source phrase {i + 1} is empty")
        T = max(len(s) for s in ids)
        src = torch.zeros(len(ids), T, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(ids), T, dtype=torch.bool, device=self.device)
        for i, s in enumerate(ids):
            src[i, : len(s)] = torch.tensor(s, device=self.device)
            mask[i, : len(s)] = True
        return self.model.context(src, mask), [len(s) for s in ids]

    def _allowed(self, logp: torch.Tensor, t: int, limit: torch.Tensor, allow_unk: bool) -> torch.Tensor:
        """Log-probabilities with forbidden choices at -inf: </s> first (no empty target),
        any word past the length limit, and [UNK] unless allowed."""
        logp = logp.clone()
        if t == 0:
            logp[:, self.eos] = -math.inf
        if not allow_unk:
            logp[:, self.unk] = -math.inf
        over = limit <= t  # rows that must stop now
        if bool(over.any()):
            keep = logp[over, self.eos].clone()
            logp[over] = -math.inf
            logp[over, self.eos] = keep
        return logp

    def _best_words(self, out: torch.Tensor, W: int, t: int, limit: torch.Tensor,
                    allow_unk: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The W likeliest allowed words of each row of maxout outputs `out` [N, M] and their
        log-probabilities, both [N, W], best first.

        The same as `_allowed(log_softmax(logits))` then `topk`, with less traffic through memory:
        the output layer runs a few rows at a time, so that each block of logits [rows, V] stays
        in cache; a block is ranked once (ranking logits ranks log-probabilities) for its W + 2
        best words, enough for W allowed ones since `_allowed` forbids at most two words (</s>,
        [UNK]) of a row that is not at its length limit; then log Z is computed in place over the
        block (`log_normalizer_`), and only the chosen words get it subtracted and the rules of
        `_allowed` applied. A row at its limit keeps only </s>, whose logit is kept aside for it.
        """
        V = len(self.tgt_vocab)
        rows, ranked = max(8, self.logit_block_bytes // (4 * V)), min(W + 2, V)
        tops, words, log_zs = [], [], []
        for i in range(0, out.shape[0], rows):
            logits = self.model.output.logits(out[i : i + rows]).float()
            top, word = largest(logits, ranked)
            eos = logits[:, self.eos].clone()
            log_z = log_normalizer_(logits)[:, None]  # overwrites the block
            log_zs.append(log_z)
            top -= log_z
            if t == 0:
                top.masked_fill_(word == self.eos, -math.inf)  # no empty target
            if not allow_unk:
                top.masked_fill_(word == self.unk, -math.inf)
            over = limit[i : i + rows] <= t  # rows that must stop now: </s> only
            if bool(over.any()):
                top[over] = -math.inf
                top[over, 0], word[over, 0] = (eos[:, None] - log_z)[over, 0], self.eos
            top, pick = top.topk(W, dim=1)
            tops.append(top)
            words.append(word.gather(1, pick))
        # log Z is finite exactly when every logit is (or -inf, a word never chosen): one check a step
        check_finite(torch.cat(log_zs), self.name, f"in the softmax of target word {t + 1}")
        return torch.cat(tops), torch.cat(words)

    @staticmethod
    def _settled(finished: list[Hypothesis], n_best: int, best_live: float) -> bool:
        """True when no live hypothesis (the best scores `best_live`, unnormalised) can enter the
        `n_best` best of `finished`: their worst is at least `best_live`."""
        if len(finished) < n_best:
            return False
        nth = sorted((h.log_prob for h in finished), reverse=True)[n_best - 1]
        return nth >= best_live

    def _decode(self, rows: torch.Tensor) -> list[str]:
        """The words that unit ids `rows` spell (subword units joined into words)."""
        return self.tgt_vocab.join(r for r in rows.tolist() if r != self.eos).split()

    @torch.inference_mode()
    def attention(self, source: str, target: str) -> np.ndarray:
        """The soft alignment alpha [target units + 1 (</s>), source units] of an RNNsearch model for one
        teacher-forced pair: row i, the weights of target unit i over the source units (each sums to 1)."""
        src_ids, _ = self.src_vocab.encode_phrases([source])
        tgt_ids, _ = self.tgt_vocab.encode_phrases([target])
        src = torch.as_tensor(src_ids[None, :], device=self.device)
        tgt = torch.as_tensor(np.append(tgt_ids, self.eos)[None, :], device=self.device)
        return self.model.alignment(src, torch.ones_like(src, dtype=torch.bool), tgt)[0].float().cpu().numpy()

    @torch.inference_mode()
    def sample(
        self,
        sources: Sequence[str],
        n: int = 50,
        seed: int = 1,
        len_ratio: float = 2.0,
        len_extra: int = 3,
        allow_unk: bool = True,
        temperature: float = 1.0,
    ) -> list[list[Hypothesis]]:
        """N samples per source; distinct targets ranked by log p, with their counts."""
        if n < 1:
            raise UserError("the number of samples must be at least 1")
        ctx, lens = self._encode(sources)
        B = len(sources)
        # the n samples of a source: n consecutive state rows, which share its context row
        limit = torch.tensor([max_words(m, len_ratio, len_extra) for m in lens], device=self.device)
        limit = limit.repeat_interleave(n)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        state = self.model.start_state(ctx).repeat_interleave(n, 0)
        e_prev = self.embed.weight.new_zeros(B * n, self.embed.embedding_dim)  # E y_0 = 0
        done = torch.zeros(B * n, dtype=torch.bool, device=self.device)
        total = torch.zeros(B * n, dtype=torch.float64, device=self.device)
        out = []
        for t in range(int(limit.max()) + 1):
            logits, state = self.model.step(ctx, state, e_prev)
            logp = torch.log_softmax(logits.float(), dim=-1)
            # the best word's log p is finite exactly when the row's softmax is: one check a step
            check_finite(logp.amax(dim=-1), self.name, f"in the softmax of target word {t + 1}")
            probs = torch.softmax(self._allowed(logp, t, limit, allow_unk) / temperature, dim=-1)
            y = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            y = torch.where(done, torch.full_like(y, self.eos), y)
            total += torch.where(done, 0.0, logp.gather(1, y[:, None]).squeeze(1).double())
            out.append(y)
            done |= y == self.eos
            if bool(done.all()):
                break
            e_prev = self.embed(y)
        seqs = torch.stack(out, 1).cpu()
        total = total.cpu().tolist()
        results = []
        for b in range(B):
            counts: Counter = Counter()
            logps: dict[tuple, float] = {}
            for k in range(b * n, (b + 1) * n):
                words = tuple(self._decode(seqs[k]))
                counts[words] += 1
                logps[words] = total[k]
            hyps = [Hypothesis(list(w), logps[w], logps[w], counts[w]) for w in counts]
            results.append(sorted(hyps, key=lambda h: (-h.score, -h.count, h.text)))
        return results

    @torch.inference_mode()
    def beam_search(
        self,
        sources: Sequence[str],
        beam: int = 5,
        n_best: int | Sequence[int] = 1,
        len_ratio: float = 2.0,
        len_extra: int = 3,
        normalize: bool = False,
        allow_unk: bool = True,
        stop_early: bool = True,
    ) -> list[list[Hypothesis]]:
        """The `n_best` best targets of each source (n_best <= beam; one number for every source, or
        one per source), best first.

        Each step extends every live hypothesis by every word and keeps the
        2K best candidates of each source: those ending in </s> are finished,
        the K best others stay live. A source is done when it has K finished
        hypotheses or reaches its length limit (where only </s> is allowed).

        Two shortcuts leave the result as it is (up to the order of candidates with equal scores, which
        a near-uniform untrained model has plenty of): a live hypothesis's candidates
        come from its own 2K best words (no other word of it can be among its
        source's 2K best candidates), so only K * 2K candidates per source are
        ranked, in float64; and the sources that are done leave the batch, so
        the decoder steps only the live ones.

        A third (`stop_early`, without `normalize`) ends a source before it has K
        finished hypotheses once its `n_best` best finished ones score at least its
        best live one: a log-probability only falls as words are added, so no live
        hypothesis can finish above them, and the result is the one the full search
        returns (up to candidates with equal scores). With length normalisation a
        longer hypothesis can overtake, so the search runs to K finished as before.
        """
        wanted = [n_best] * len(sources) if isinstance(n_best, int) else list(n_best)
        if len(wanted) != len(sources):
            raise UserError(f"{len(wanted)} n-best sizes for {len(sources)} sources")
        if beam < 1 or not all(1 <= n <= beam for n in wanted):
            raise UserError(f"need beam >= 1 and 1 <= n_best <= beam, got beam={beam}, n_best={n_best}")
        K = beam
        early = stop_early and not normalize
        ctx, lens = self._encode(sources)
        B, dev = len(sources), self.device
        limit = torch.tensor([max_words(n, len_ratio, len_extra) for n in lens], device=dev).repeat_interleave(K)
        # the K hypotheses of a source: K consecutive state rows, which share its context row
        # (`PhraseModel.step_readout`), so that a source's context is neither copied K times nor gathered
        state = self.model.start_state(ctx).repeat_interleave(K, 0)
        e_prev = self.embed.weight.new_zeros(B * K, self.embed.embedding_dim)
        # live scores [A, K] of the A sources still searched (`alive`, their indices): one live hypothesis each to start
        alive = list(range(B))
        live = torch.full((B, K), -math.inf, dtype=torch.float64, device=dev)
        live[:, 0] = 0.0
        tokens = torch.zeros(B, K, 0, dtype=torch.long, device=dev)
        finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        V = len(self.tgt_vocab)
        W = min(2 * K, V)  # words kept per live hypothesis
        for t in range(int(limit.max()) + 1):
            A = len(alive)
            out, state = self.model.step_readout(ctx, state, e_prev)
            row_top, row_word = self._best_words(out, W, t, limit, allow_unk)  # [A * K, W]
            cand = (live[:, :, None] + row_top.double().view(A, K, W)).view(A, K * W)
            top, idx = cand.topk(min(2 * K, K * W), dim=1)  # [A, 2K]
            origin, word = idx // W, row_word.view(A, K * W).gather(1, idx)
            # the next live hypotheses, built as lists and made tensors once per step
            new_live = [[-math.inf] * K for _ in range(A)]
            new_origin = [[0] * K for _ in range(A)]
            new_word = [[self.eos] * K for _ in range(A)]
            top_l, origin_l, word_l = top.tolist(), origin.tolist(), word.tolist()
            keep = []
            for a, b in enumerate(alive):
                k = 0
                for j in range(len(top_l[a])):
                    score = top_l[a][j]
                    if score == -math.inf:
                        break
                    if word_l[a][j] == self.eos:
                        if len(finished[b]) < K:
                            units = tokens[a, origin_l[a][j]]
                            words = self._decode(units)
                            # per predicted symbol: the units and </s>
                            norm = score / (int((units != self.eos).sum()) + 1) if normalize else score
                            finished[b].append(Hypothesis(words, score, norm))
                    elif k < K:
                        if k == 0:
                            best_live = score  # candidates come best first
                        new_live[a][k], new_origin[a][k], new_word[a][k] = score, origin_l[a][j], word_l[a][j]
                        k += 1
                if len(finished[b]) < K and k > 0 and not (early and self._settled(finished[b], wanted[b], best_live)):
                    keep.append(a)
            if not keep:
                break
            kept = torch.tensor(keep, device=dev)
            new_live = torch.tensor(new_live, dtype=torch.float64, device=dev)
            new_origin = torch.tensor(new_origin, dtype=torch.long, device=dev)
            new_word = torch.tensor(new_word, dtype=torch.long, device=dev)
            rows = (kept[:, None] * K + new_origin[kept]).view(-1)  # the kept sources' surviving hypotheses
            state = state[rows]
            if len(keep) < A:  # sources that are done leave the batch
                ctx = ctx.select(kept)
                limit = limit.view(A, K)[kept].view(-1)
                alive = [alive[a] for a in keep]
            tokens = torch.cat([tokens[kept].gather(1, new_origin[kept][:, :, None].expand(-1, -1, tokens.shape[2])),
                                new_word[kept][:, :, None]], 2)
            live = new_live[kept]
            e_prev = self.embed(new_word[kept].view(-1))
        return [sorted(f, key=lambda h: -h.score)[:n] for f, n in zip(finished, wanted)]


def read_sources(path: str) -> list[str]:
    """Source phrases, one per line, from a plain or gzip file ('-' for stdin)."""
    from mtcommon.textio import InputError, iter_lines

    out = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            raise InputError(path, lineno, "empty source phrase")
        out.append(line.strip())
    return out
