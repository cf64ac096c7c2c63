"""llama.cpp as an incremental model: GGUF files as people run them on CPUs and edge devices.

One llama.cpp context serves every session of a process, the way llama.cpp's own server does it: each
session's cache is one *sequence*, and the windows of several sessions go into one ``llama_decode`` batch (each
token tagged with its session's sequence id and position), so cross-session batching needs no padding. The
sequences share the cells of one unified KV cache, or in exact mode each has a stream of cells of its own (so
its cells stay in the order a one-session run has them; llama.cpp then computes consecutive sequence ids with
as many tokens each in one pass). Rollback is ``llama_memory_seq_rm`` past a position.

The state of a session (``SeqState``) remembers exactly which tokens its sequence holds, like the torch
backend's ``KVState``; ``logits`` keeps the longest common prefix with the requested sequence and feeds
the rest. A sequence id is taken on the first feed and given back when the state is dropped (garbage
collected: the engines replace or forget states); ids are recycled on the model worker thread, the only
thread that calls llama.cpp. With ``share_prefixes`` a state that starts empty shares the cells of the
longest prefix (16 tokens or more) another live state holds — a system prompt, a chat template, a prompt
many sessions send — instead of computing them again, as llama.cpp's server reuses its prompt cache. The
cells of dropped states are kept too (a quarter of the sequences at most, least recently used given back
first, all of them when the context runs out of cells), so a retried request or a re-opened session shares
them as well.

Logits come back as float32 numpy rows over the full vocabulary, so the pure verification and sampling
code is the same as for every other backend. Numerics: llama.cpp's kernels may group a sum differently
for a batch of k + 1 tokens than for one token at a time, so greedy output can in principle differ from
llama.cpp's own one-token decoding at a near-tie; bench/bench_llamacpp.py measures it. Cells shared from
another session were computed in that session's batch, so sharing is one more such batch shape.
"""
from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.backends.assets import PACKAGED, ensure_gguf
from edgespec.backends.incremental import IncrementalLM
from edgespec.errors import ResourceExhausted
from edgespec.verify.greedy import common_prefix_length

log = logging.getLogger(__name__)

MAX_SEQUENCES = 256   # llama.cpp's limit on sequences per context (LLAMA_MAX_SEQ)
MIN_SHARED_PREFIX = 16  # tokens: a state starting empty shares at least this much of another's cache, or none


def _llama():
    """The llama_cpp module, quiet (its default logger prints every load line to stderr)."""
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)
    return llama_cpp


_tiled_in_process: list[bool] = []   # the GGML_CPU_TILED_MM this process's ggml runs with, once a model loaded


def _set_tiled(tiled: bool) -> None:
    """ggml reads GGML_CPU_TILED_MM once, at the first matmul of the process: every model of a process shares it."""
    if not _tiled_in_process:
        if not tiled:
            os.environ["GGML_CPU_TILED_MM"] = "0"
        _tiled_in_process.append(os.environ.get("GGML_CPU_TILED_MM", "1") not in ("0", ""))
    if _tiled_in_process[0] != tiled:
        raise ValueError(f"this process's llama.cpp already runs with the tiled matmul {'on' if _tiled_in_process[0] else 'off'}"
                         f"; a model with it {'on' if tiled else 'off'} needs a process of its own")


class ContextFull(ResourceExhausted):
    """The context has no room: no free sequence id or no free KV cells for a batch (back off and retry:
    idle sessions' caches are evicted meanwhile)."""

    def __init__(self, message: str):
        super().__init__(message, retry_after_seconds=1.0)


@dataclass(frozen=True, slots=True)
class LlamaExact:
    """The llama.cpp settings that decide whether a batch of n rows computes what n one-row decodes would
    (docs/llamacpp-exactness.md has the measurements)."""
    flash_attn: bool = True        # off, KQ goes through a matmul whose kernel changes at 2 rows
    repack: bool = True            # weights repacked for the CPU's gemm (ne11 >= 4 rows) / gemv kernels
    single_threads: int = 0        # threads of a one-token decode (0: as many as a batch's); 1 keeps its
                                   # attention in one chunk, as every row of a batch is (a batch's threads
                                   # while the KV view is short enough for one chunk on any: ONE_CHUNK_POSITIONS)
    unified: bool = True           # one KV cell pool for all sequences (False: a stream of cells each)
    tiled: bool = True             # ggml's tiled K-quant matmul for batches of 8+ rows (GGML_CPU_TILED_MM)
    ubatch_tokens: int = 512       # rows of one compute pass (llama.cpp's -ub); a prompt is fed in such passes
    window_rows: int = 0           # rows of one llama_decode of windows (0: the batch size); flash attention
                                   # computes 64+ query rows in tiles, otherwise one row at a time
    far_rows_alone: bool = False   # a row past ONE_CHUNK_POSITIONS is decoded alone, on every thread, as a
                                   # one-token decode of llama.cpp's own run splits its attention there

    def cli(self, threads: int) -> str:
        """The same settings for llama.cpp's own tools (llama-completion, llama-cli, llama-server), to reproduce
        a target-only run (a one-session run: a unified or per-sequence cache holds the same cells)."""
        env = "" if self.tiled else "GGML_CPU_TILED_MM=0 "
        return (f"{env}-t {self.single_threads or threads} -tb {threads} -fa {'on' if self.flash_attn else 'off'}"
                f"{'' if self.repack else ' --no-repack'} -ub {self.ubatch_tokens}")

    def describe(self) -> str:
        past = f" past {ONE_CHUNK_POSITIONS} positions" if self.single_threads else ""
        alone = f", rows past {ONE_CHUNK_POSITIONS} positions decoded alone" if self.far_rows_alone else ""
        return (f"flash attention {'on' if self.flash_attn else 'off'}, weight repacking "
                f"{'on' if self.repack else 'off'}, tiled matmul {'on' if self.tiled else 'off'}, one-token decodes "
                f"on {self.single_threads or 'all'} thread(s){past}, ubatch {self.ubatch_tokens}, windows in decodes of "
                f"{self.window_rows or 'any'} rows{alone}, KV {'unified' if self.unified else 'per sequence'}")


# Measured batch-invariant (bench/llama_invariance.py): llama.cpp's own kernels (repacked weights, tiled matmul) with
# windows in decodes of at most 3 rows (the repacked weights' gemv takes 1 to 3 rows, each as one row alone; from 4
# rows a gemm kernel rounds otherwise; load() checks the 3 on this CPU and build and takes fewer where it fails);
# attention by one flash-attention pass per query row in order over the cells (tiles start at 64 rows). A one-token
# decode of llama.cpp's own run on N threads splits its attention into N chunks once the KV view reaches 512 cells
# (past ONE_CHUNK_POSITIONS), and a row of a batch is never split: so past there each row is decoded alone, on every
# thread, as llama.cpp's own -t N run decodes it (below, windows' rows share decodes). Each session has a stream of
# cells of its own: in a unified cache a token can land in a cell another session's rollback freed, before the
# session's earlier cells, and attention then sums its cells in another order than a one-session run does
# (measured: 10 of 16 concurrent n-gram sessions diverged). A prompt is computed as llama.cpp's own run computes it,
# so the settings are llama.cpp's defaults.
EXACT = LlamaExact(window_rows=3, unified=False, far_rows_alone=True)
# ggml's flash attention splits a one-token decode's attention into a chunk per thread where the KV view has 512
# cells or more (ggml-cpu ops.cpp: nek1 >= 512); the view is the stream's used cells padded to 256. Below this
# many positions (the view 256 cells, 16 spare for cells a window held) a one-token decode in a stream of its own
# is computed in one chunk on any number of threads, bit for bit as on one (tested). Past it, exact mode decodes a
# row alone on every thread (far_rows_alone; 48 ms a token for the default target on 2 threads, 586-token prompts,
# against 86-93 ms on one thread, the AMD Zen 4 machine); settings with one-thread one-token decodes run them on the
# batch's threads below it (in a unified cache the view spans every session's cells, so one thread throughout).
ONE_CHUNK_POSITIONS = 240
# The verifier prefills a prompt in parts of this many tokens (its --prefill-chunk; llama.cpp's ubatch), verifying
# other sessions' windows between them (measured: docs/benchmarks.md, "Prefill in parts").
PREFILL_CHUNK = 64
CHECKED_WINDOW_ROWS = 8   # exact settings with windows in decodes of 2 to this many rows are checked at load

# The context when neither size is given: a unified cache pools its cells, so 64 sessions share 16384; with a
# stream per session each has ctx_tokens / max_sequences of its own, so 16 sessions of 2048 tokens (as llama.cpp's
# server splits -c over -np slots).
DEFAULT_CONTEXT = {True: (16384, 64), False: (32768, 16)}


def context_size(exact: LlamaExact, ctx_tokens: int | None, max_sequences: int | None) -> tuple[int, int]:
    """(KV cells in all, sequences): what is given, the rest from DEFAULT_CONTEXT; with a stream per session, one
    size given keeps the default cells per session (2048), up to the default number of sessions."""
    cells, sequences = DEFAULT_CONTEXT[exact.unified]
    per_session = cells // sequences
    if max_sequences is None:
        max_sequences = sequences if exact.unified or ctx_tokens is None else \
            max(1, min(sequences, ctx_tokens // per_session))
    if ctx_tokens is None:
        ctx_tokens = cells if exact.unified else max_sequences * per_session
    return ctx_tokens, max_sequences




def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as taskset or a container's cpuset sets it): the default
    thread count, so two services pinned to their own CPUs on one host do not each start a thread per CPU."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:   # no affinity on this platform
        return os.cpu_count() or 1


def exact_settings(mode: str, threads: int, ubatch_tokens: int = 0) -> LlamaExact | None:
    """--exact: "on" EXACT, "off" llama.cpp's defaults (None), "auto" EXACT where the model runs on one thread
    (free there; with more, past ONE_CHUNK_POSITIONS a window's rows are decoded one at a time, so drafting saves
    nothing there and concurrent sessions share no decodes). ``ubatch_tokens`` (0: llama.cpp's 512) is the
    verifier's --prefill-chunk: its prompts' parts."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"exact mode must be auto, on or off, got {mode!r}")
    if mode == "auto":
        mode = "on" if (threads or usable_cpus()) == 1 else "off"
    exact = EXACT if mode == "on" else None
    return replace(exact or LlamaExact(), ubatch_tokens=ubatch_tokens) if ubatch_tokens else exact


@dataclass(eq=False, slots=True, weakref_slot=True)
class SeqState:
    """A session's sequence in the shared context and the exact tokens its KV cells hold."""
    tokens: list[int] = field(default_factory=list)
    seq_id: int | None = None   # taken on the first feed
    # The logits after tokens[-1], float32 [vocab], when the forward that fed it kept them: a prompt's last row from
    # its prefill, so the first window does not feed that token again (in a window's batch its key and value
    # would be computed by other kernels than the prefill's, and so differ from llama.cpp's own run).
    last_row: np.ndarray | None = None


def chunk_lengths(rows: int, size: int) -> list[int]:
    """The decodes ``rows`` rows go in, at most ``size`` each, as even as they can be: 4 rows in decodes of 3 go
    as 2 + 2, not 3 + 1. A lone row is a one-token decode, which in exact mode runs on one thread; two 2-row
    decodes on 2 threads cost 0.76-0.84x a 3-row and a one-token decode (the default target, 400-token contexts,
    this project's AVX-512 machine)."""
    parts = -(-rows // size)
    return [rows // parts + (i < rows % parts) for i in range(parts)]


class LlamaCppLM(IncrementalLM):
    """A GGUF model in one llama.cpp context; every call on one thread (the model worker)."""

    def __init__(self, path: str | Path, threads: int = 0, ctx_tokens: int | None = None,
                 max_sequences: int | None = None, batch_tokens: int = 2048, share_prefixes: bool = False,
                 exact: LlamaExact | None = None):
        llama = self._lib = _llama()
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model {path} does not exist")
        self.exact = exact or LlamaExact()
        ctx_tokens, max_sequences = context_size(self.exact, ctx_tokens, max_sequences)
        if not 1 <= max_sequences <= MAX_SEQUENCES:
            raise ValueError(f"max_sequences must be in 1..{MAX_SEQUENCES}, got {max_sequences}")
        started = time.perf_counter()
        llama.llama_backend_init()
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = 0
        # Read the weights into memory instead of mapping the file: llama.cpp repacks the quantised matrices
        # for the CPU kernels into buffers of its own, so a mapping would keep a second, unused copy of them
        # resident (measured with the default target: 2.28 GB resident mapped, 1.68 GB read; same decode speed).
        model_params.load_mode = llama.LLAMA_LOAD_MODE_NONE
        model_params.use_extra_bufts = self.exact.repack
        _set_tiled(self.exact.tiled)
        self._model = llama.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path} (not a GGUF model?)")
        threads = threads or usable_cpus()
        params = llama.llama_context_default_params()
        params.n_ctx = ctx_tokens
        params.n_batch = batch_tokens
        params.n_ubatch = min(self.exact.ubatch_tokens, batch_tokens)
        params.n_seq_max = max_sequences
        params.n_threads_batch = threads
        params.n_threads = self.exact.single_threads or threads   # llama.cpp's threads for a one-token decode
        self._single_threads = params.n_threads   # as set now (_decode raises it for short one-token decodes)
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.exact.flash_attn else \
            llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # unified: one cell pool shared by all sessions, as llama.cpp's server does; else a stream per sequence
        params.kv_unified = self.exact.unified
        params.no_perf = True
        self._ctx = llama.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise ValueError(f"llama.cpp could not create a context of {ctx_tokens} tokens for {path}")
        self._memory = llama.llama_get_memory(self._ctx)
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.name = str(path)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self._vocab))
        self.ctx_tokens = int(llama.llama_n_ctx(self._ctx))
        # the cells one session can hold: all of them, or its own stream's (llama.cpp pads a stream to 256 cells)
        self.session_tokens = self.ctx_tokens if self.exact.unified else self.ctx_tokens // max_sequences
        self.batch_tokens = batch_tokens
        self.threads = threads
        self.max_sequences = max_sequences
        self.device = "cpu"
        self.kv_bytes_per_token = self._kv_bytes_per_token()
        # the lowest free id first: with a stream per sequence llama.cpp computes consecutive ids with as many
        # tokens each in one pass, and one pass per run otherwise
        self._free_ids = list(range(max_sequences))
        self._live: weakref.WeakSet[SeqState] = weakref.WeakSet()   # states holding a sequence id
        self.share_prefixes = share_prefixes
        self.shared_tokens = 0                   # prompt tokens taken from another sequence's cells, not computed
        # share_prefixes: cells of dropped states kept for later sessions, seq id -> tokens, least recent first
        self._retained: OrderedDict[int, list[int]] = OrderedDict()
        self.max_retained = max_sequences // 4 if share_prefixes else 0
        self._released: list[tuple[int, list[int]]] = []   # (id, tokens) of dropped states, for the worker thread
        self._released_lock = threading.Lock()   # finalizers may run on any thread
        self._batch = llama.llama_batch_init(batch_tokens, 0, 1)
        log.info("loaded %s with llama.cpp in %.1fs: %d threads, %d KV cells, %d sequences of up to %d tokens; %s "
                 "(llama.cpp's own tools: %s)", path, time.perf_counter() - started, threads, self.ctx_tokens,
                 max_sequences, self.session_tokens, self.exact.describe(), self.exact.cli(threads))

    @property
    def placement(self) -> str:
        return f"cpu llama.cpp GGUF ({self.threads} threads)"

    @property
    def far_positions(self) -> int:
        """ONE_CHUNK_POSITIONS where the costs change past them (exact mode, a stream a session): a window's rows
        are decoded one at a time there (far_rows_alone, more than one thread: _window_lengths), or a one-token
        decode runs on fewer threads than a window's rows do (_decode); 0 where nothing changes."""
        one = self.exact.single_threads
        fewer = one and not self.exact.unified and one < self.threads
        return ONE_CHUNK_POSITIONS if fewer or (self.exact.far_rows_alone and self.threads > 1) else 0

    def _kv_bytes_per_token(self) -> int:
        """f16 keys and values: layers x 2 x kv heads x head dim x 2 bytes (from the GGUF metadata)."""
        llama = self._lib
        layers = llama.llama_model_n_layer(self._model)
        heads, kv_heads = llama.llama_model_n_head(self._model), llama.llama_model_n_head_kv(self._model)
        head_dim = llama.llama_model_n_embd(self._model) // max(1, heads)
        return int(layers * 2 * kv_heads * head_dim * 2)

    def eos_ids(self) -> list[int]:
        """Every end-of-generation token llama.cpp knows for this vocabulary (EOS, EOT, <|im_end|> ...)."""
        llama = self._lib
        return [t for t in range(self.vocab_size) if llama.llama_vocab_is_eog(self._vocab, t)]

    # -- states ------------------------------------------------------------------------------------

    def new_state(self) -> SeqState:
        return SeqState()

    def crop(self, state: SeqState, length: int) -> None:
        """Keep the first ``length`` cached positions (no-op if already shorter)."""
        if len(state.tokens) > length:
            self._lib.llama_memory_seq_rm(self._memory, state.seq_id, length, -1)
            del state.tokens[length:]
            state.last_row = None

    def _attach(self, state: SeqState) -> None:
        """Give a state a sequence id of its own (the first time it is fed)."""
        if state.seq_id is not None:
            return
        self._recycle()
        if not self._free_ids and self._retained:
            self._give_back(next(iter(self._retained)))
        if not self._free_ids:
            raise ContextFull(f"all {self.max_sequences} llama.cpp sequences are in use")
        state.seq_id = heapq.heappop(self._free_ids)
        # The finalizer holds the token list, not the state: the list is only ever changed in place.
        weakref.finalize(state, self._release, state.seq_id, state.tokens)
        self._live.add(state)

    def _share_prefix(self, state: SeqState, seq: list[int], limit: int) -> None:
        """Start an empty state from the longest prefix of ``seq`` another live state holds (a system prompt
        or a prompt many sessions share, a re-opened session): its cells are shared, not recomputed
        (llama_memory_seq_cp in the unified cache adds this sequence to them; a later crop of either
        sequence removes only its own). At least MIN_SHARED_PREFIX tokens, at most ``limit`` (the positions
        whose logits are asked for, and at least the last one, are computed)."""
        best, length = None, MIN_SHARED_PREFIX - 1
        donors = [(other.seq_id, other.tokens) for other in list(self._live) if other is not state and other.tokens]
        for seq_id, tokens in [*donors, *self._retained.items()]:
            shared = min(common_prefix_length(tokens, seq), limit)
            if shared > length:
                best, length = seq_id, shared
        if best is not None:
            if self.exact.unified:
                self._lib.llama_memory_seq_cp(self._memory, best, state.seq_id, 0, length)
            else:   # across streams llama.cpp copies a whole stream only
                self._lib.llama_memory_seq_cp(self._memory, best, state.seq_id, -1, -1)
                self._lib.llama_memory_seq_rm(self._memory, state.seq_id, length, -1)
            if best in self._retained:
                self._retained.move_to_end(best)
            state.tokens[:] = seq[:length]
            self.shared_tokens += length

    def _release(self, seq_id: int, tokens: list[int]) -> None:
        with self._released_lock:
            self._released.append((seq_id, tokens))

    def _recycle(self) -> None:
        """Keep the cells of dropped states for sharing (share_prefixes) or clear them, and make the ids of
        those not kept free again (worker thread only)."""
        with self._released_lock:
            released, self._released = self._released, []
        for seq_id, tokens in released:
            if self.max_retained and len(tokens) >= MIN_SHARED_PREFIX:
                self._retained[seq_id] = list(tokens)
            else:
                self._lib.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
                heapq.heappush(self._free_ids, seq_id)
        while len(self._retained) > self.max_retained:
            self._give_back(next(iter(self._retained)))

    def _give_back(self, seq_id: int) -> None:
        """Clear a kept sequence's cells and free its id."""
        del self._retained[seq_id]
        self._lib.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        heapq.heappush(self._free_ids, seq_id)

    @property
    def retained_tokens(self) -> int:
        """Cells held for dropped states (share_prefixes), tokens."""
        return sum(len(tokens) for tokens in self._retained.values())

    # -- forward -----------------------------------------------------------------------------------

    def logits(self, state: SeqState, seq: Sequence[int]) -> np.ndarray:
        """Logits after each newly fed token of ``seq``: float32 [m, vocab], m >= 1."""
        [rows] = self._forward([state], [seq], None)
        return rows

    def logits_rows(self, state: SeqState, seq: Sequence[int], last: int) -> np.ndarray:
        [rows] = self._forward([state], [seq], [last])
        return rows

    def logits_rows_batch(self, states: Sequence[SeqState], seqs: Sequence[Sequence[int]],
                          lasts: Sequence[int]) -> list[np.ndarray]:
        """Every session's rows from one llama_decode batch (split only past the batch size)."""
        return self._forward(states, seqs, lasts)

    def prefill(self, state: SeqState, tokens: Sequence[int]) -> None:
        """Cache ``tokens`` as llama.cpp feeds a prompt (in passes of ubatch_tokens), keeping the logits after the
        last one for the next call (which then feeds only what follows). A prompt prefilled in calls that each
        end on a multiple of ubatch_tokens is computed exactly as one call computes it."""
        if tokens:
            self._forward([state], [tokens], [1], prompt=True)

    def _forward(self, states: Sequence[SeqState], seqs: Sequence[Sequence[int]],
                 lasts: Sequence[int] | None, prompt: bool = False) -> list[np.ndarray]:
        """Sync each state to its sequence (longest common prefix, at least one token fed), feed the rest
        of all of them, and return for each the logits of its last ``lasts[i]`` fed tokens (None: all)."""
        feeds: list[tuple[SeqState, int, list[int], int]] = []   # (state, start position, tokens, outputs)
        reused: list[np.ndarray | None] = []   # the cached row after the last cached token, when it is asked for
        for i, (state, seq) in enumerate(zip(states, seqs)):
            seq = list(seq)
            if not seq:
                raise ValueError("cannot score an empty sequence")
            self._attach(state)
            if self.share_prefixes and lasts is not None and not state.tokens:
                self._share_prefix(state, seq, len(seq) - max(1, lasts[i]))   # the rows asked for are computed
            common = common_prefix_length(state.tokens, seq)
            reuse = (lasts is not None and state.last_row is not None and common == len(state.tokens)
                     and lasts[i] == len(seq) - common + 1)
            keep = common if reuse else min(common, len(seq) - 1)
            self.crop(state, keep)
            new = seq[keep:]
            outputs = (len(new) if lasts is None else lasts[i]) - reuse
            if outputs > len(new):
                raise ValueError(f"asked for {outputs} positions but only {len(new)} were fed")
            feeds.append((state, keep, new, outputs))
            reused.append(state.last_row if reuse else None)
        rows = [np.empty((outputs + (row is not None), self.vocab_size), np.float32)
                for (_, _, _, outputs), row in zip(feeds, reused)]
        filled = [0] * len(feeds)
        for f, row in enumerate(reused):
            if row is not None:
                rows[f][0] = row
                filled[f] = 1
        # Tokens in order, session after session; a batch holds at most batch_tokens of them. A prompt (one state
        # fed from empty, or a prefill's next part) goes in such batches, as llama.cpp feeds one; windows in batches
        # of window_rows.
        order = range(len(feeds)) if self.exact.unified else sorted(range(len(feeds)), key=lambda f: feeds[f][0].seq_id)
        plan = [(f, j) for f in order for j in range(len(feeds[f][2]))]
        prompt = prompt or (len(feeds) == 1 and feeds[0][1] == 0)
        # A prompt goes in batches of batch_tokens as llama.cpp's own run feeds it (its ubatches then fall alike).
        lengths = [self.batch_tokens] * -(-len(plan) // self.batch_tokens) if prompt else \
            self._window_lengths(feeds, plan)
        start = 0
        for length in lengths:
            self._decode(feeds, plan[start:start + length], rows, filled)
            start += length
        for (state, keep, new, outputs), out in zip(feeds, rows):
            if new:
                state.tokens[keep:] = new
                state.last_row = out[-1].copy() if outputs else None
        return rows

    def _window_lengths(self, feeds, plan) -> list[int]:
        """The decodes windows' rows go in: window_rows at most; with far_rows_alone (and more than one thread) a
        row past ONE_CHUNK_POSITIONS alone, near rows around it in decodes of their own."""
        size = self.exact.window_rows or self.batch_tokens
        if not (self.exact.far_rows_alone and self.threads > 1):
            return chunk_lengths(len(plan), size)
        lengths, near = [], 0
        for f, j in plan:
            if feeds[f][1] + j < ONE_CHUNK_POSITIONS:
                near += 1
                continue
            lengths += chunk_lengths(near, size) if near else []
            lengths.append(1)
            near = 0
        return lengths + (chunk_lengths(near, size) if near else [])

    def _decode(self, feeds, chunk, rows, filled) -> None:
        llama, batch = self._lib, self._batch
        wanted = []
        for i, (f, j) in enumerate(chunk):
            state, keep, new, outputs = feeds[f]
            batch.token[i] = new[j]
            batch.pos[i] = keep + j
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = state.seq_id
            out = j >= len(new) - outputs
            batch.logits[i] = out
            if out:
                wanted.append(f)
        batch.n_tokens = len(chunk)
        if self.exact.single_threads and not self.exact.unified:   # a stream a session: its own cells
            # llama.cpp runs every one-row pass on the one-token threads, and it splits a decode of several
            # streams' rows into passes of consecutive streams with as many rows each: a one-row pass comes out of
            # bigger decodes too (2 rows of A beside 1 of B: A's second alone). So any row past the one-chunk
            # positions sets one thread, whatever the decode's size.
            far = max(batch.pos[i] for i in range(len(chunk)))
            self._set_single_threads(self.threads if far < ONE_CHUNK_POSITIONS else self.exact.single_threads)
        status = llama.llama_decode(self._ctx, batch)
        if status == 1 and self._retained:   # no free cells: give back the kept ones and try once more
            while self._retained:
                self._give_back(next(iter(self._retained)))
            status = llama.llama_decode(self._ctx, batch)
        if status == 1:
            raise ContextFull(f"no room in the llama.cpp context for {len(chunk)} more tokens "
                              f"({self.ctx_tokens} KV cells in all, {self.session_tokens} per session)")
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
        if wanted:
            logits = np.ctypeslib.as_array(llama.llama_get_logits(self._ctx), shape=(len(wanted), self.vocab_size))
            for row, f in zip(logits, wanted):
                rows[f][filled[f]] = row
                filled[f] += 1

    def _set_single_threads(self, threads: int) -> None:
        """The threads of llama.cpp's next one-token decodes (batches keep theirs)."""
        if threads != self._single_threads:
            self._lib.llama_set_n_threads(self._ctx, threads, self.threads)
            self._single_threads = threads

    def settle_window_rows(self) -> int:
        """Check that a decode of 2 .. exact.window_rows rows computes each row as a one-token decode does, here
        (a 16-token sequence, then its next tokens one at a time against the same tokens in one decode), and feed
        windows in decodes of the largest row count up to which every count agrees: 1 if none does (each row then
        is a one-token decode). Returns that count. On the CPUs measured 3 rows agree with llama.cpp's defaults
        (docs/llamacpp-exactness.md); a CPU or build whose kernels switch earlier gets fewer rows, not other text."""
        rows = self.exact.window_rows
        if os.environ.get("EDGESPEC_LLAMA_FAIL_ROW_CHECK") == "1":   # tests: take the path a failing check takes
            agreed = 1
        else:
            prompt = [(7 + 97 * i) % self.vocab_size for i in range(16)]
            state = self.new_state()
            steps = [self.logits_rows(state, prompt, 1)[0]]
            cont: list[int] = []
            for _ in range(rows):
                cont.append(int(np.argmax(steps[-1])))
                steps.append(self.logits_rows(state, prompt + cont, 1)[0])
            agreed = 1
            for n in range(2, rows + 1):
                self.crop(state, len(prompt))
                if not np.array_equal(self.logits_rows(state, prompt + cont[:n], n), np.stack(steps[1:n + 1])):
                    break
                agreed = n
            del state
        if agreed < rows:
            log.warning("llama.cpp computes a decode of %d rows otherwise than one-token decodes on this CPU and "
                        "build: windows go in decodes of %d row(s), so greedy output stays llama.cpp's own; "
                        "windows cost more (a pass per %d row(s))", agreed + 1, agreed, agreed)
            self.exact = replace(self.exact, window_rows=agreed)
        return agreed

    def close(self) -> None:
        llama = self._lib
        if getattr(self, "_ctx", None):
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            llama.llama_model_free(self._model)
            self._ctx = self._model = None


def gguf_path(spec: str) -> Path:
    """A packaged model's GGUF file ("target", "draft", "smollm2") or a path to a .gguf file."""
    if spec in PACKAGED:
        return ensure_gguf(spec)
    path = Path(spec)
    if path.suffix != ".gguf" or not path.is_file():
        raise FileNotFoundError(f"model {spec!r}: not a GGUF file (the llama.cpp backend takes 'target', 'draft', "
                                f"'smollm2' or the path of an existing .gguf file)")
    return path


def load(spec: str, threads: int = 0, ctx_tokens: int | None = None, max_sequences: int | None = None,
         share_prefixes: bool = False, exact: LlamaExact | None = None) -> LlamaCppLM:
    """The model named by ``spec`` (see gguf_path) in a llama.cpp context of its own; with exact settings that feed
    windows in decodes of a few rows, those rows checked on this CPU first (LlamaCppLM.settle_window_rows)."""
    lm = LlamaCppLM(gguf_path(spec), threads=threads, ctx_tokens=ctx_tokens, max_sequences=max_sequences,
                    share_prefixes=share_prefixes, exact=exact)
    if exact is not None and 1 < exact.window_rows <= CHECKED_WINDOW_ROWS:
        lm.settle_window_rows()
    return lm
