"""Grammar-constrained decoding with xgrammar: tokenizer info, compiled grammars and the per-row
token bitmasks that the decoding loop hands the verification ops (docs: serving.md).

xgrammar (https://github.com/mlc-ai/xgrammar, the grammar engine of vLLM, SGLang and
TensorRT-LLM) is an optional dependency: ``pip install "specdec-kernels[grammar]"``. It is
imported when a function that needs it is first called; :func:`allowed_from_bitmask` and
:func:`apply_bitmask_reference` are plain torch and work without it.

Vocabulary of this file:

- *bitmask*: int32 ``[..., W]``, ``W = ceil(V / 32)``, xgrammar's layout
  (``xgrammar.allocate_token_bitmask``): bit ``j`` of word ``w`` set means token ``32 w + j``
  is allowed; bits past ``V`` are ignored.
- *matcher*: one ``xgrammar.GrammarMatcher`` per batch row, holding the row's grammar state
  after its *committed* tokens (the ones the loop emitted).
- *draft walk*: the matcher advanced along a row's draft tokens to fill the mask of each draft
  position, then rolled back to where it was (:meth:`GrammarState.fill_draft_bitmasks`,
  :meth:`GrammarState.push_drafts` / :meth:`GrammarState.discard_drafts`).

This package's byte-level models (the bundled pair) have ``V = 257``: token ``i < 256`` is the
byte ``i`` and ``256`` is ``<eos>``, the grammar's stop token: once the grammar is complete the
mask allows ``<eos>``, and a row whose matcher accepts it is done, as at ``eos_token_id``.

Examples
--------
>>> import torch
>>> from specdec_kernels.grammar import allowed_from_bitmask
>>> mask = torch.tensor([[0b1011, -1]], dtype=torch.int32)  # [1, W=2], V = 37
>>> allowed_from_bitmask(mask, 37)[0, :5].tolist()  # tokens 0, 1 and 3 of the first word
[True, True, False, True, False]
>>> allowed_from_bitmask(mask, 37).shape  # bits 37 .. 63 of the last word are ignored
torch.Size([1, 37])
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from specdec_kernels.models.bundled import EOS_ID
from specdec_kernels.reference import bitmask as ref_bitmask

#: The bytes of this package's byte-level vocabulary; ``EOS_ID`` (256) follows them.
NUM_BYTES = 256

_INSTALL = 'pip install "specdec-kernels[grammar]"'


def _xgr():
    """The ``xgrammar`` module, or an ``ImportError`` that says how to install it."""
    try:
        import xgrammar
    except ImportError as exc:
        raise ImportError(
            "specdec_kernels.grammar needs xgrammar, the optional dependency of the extra "
            f"specdec-kernels[grammar]: {_INSTALL}"
        ) from exc
    return xgrammar


def bitmask_width(vocab_size: int) -> int:
    """``W = ceil(vocab_size / 32)``: int32 words per bitmask row.

    >>> bitmask_width(257), bitmask_width(32), bitmask_width(128256)
    (9, 1, 4008)
    """
    return ref_bitmask.width(vocab_size)


# ------------------------------------------------------------------------------------ bitmasks
def _check_width(bitmask: torch.Tensor, vocab_size: int) -> None:
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 (xgrammar's layout), got {bitmask.dtype}")
    if bitmask.dim() < 1 or bitmask.shape[-1] != bitmask_width(vocab_size):
        raise ValueError(
            f"vocabulary mismatch: bitmask {list(bitmask.shape)} has "
            f"{bitmask.shape[-1] if bitmask.dim() else 0} words per row, but the logits' "
            f"vocabulary V={vocab_size} needs W=ceil(V/32)={bitmask_width(vocab_size)}"
        )


def allowed_from_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The allowed tokens of an xgrammar bitmask, as booleans.

    Parameters
    ----------
    bitmask : Tensor
        ``[..., W]`` int32, ``W = ceil(V / 32)``: bit ``j`` of word ``w`` set means token
        ``32 w + j`` is allowed.
    vocab_size : int
        ``V``; bits past it are ignored.

    Returns
    -------
    Tensor
        ``[..., V]`` bool, on the bitmask's device.

    Raises
    ------
    ValueError
        ``bitmask`` is not int32, or its width is not ``ceil(V / 32)`` (the message names both).
    """
    _check_width(bitmask, vocab_size)
    return ref_bitmask.allowed(bitmask, vocab_size)


def apply_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits.masked_fill(~allowed, -inf)``: the masked logits a bitmask stands for.

    A test oracle only. The verification ops take ``token_bitmask=`` and treat a disallowed
    token as a ``-inf`` logit inside the kernel; they never write this ``[..., V]`` copy, and
    ``op(logits, ..., token_bitmask=m)`` equals ``op(apply_bitmask_reference(logits, m), ...)``
    for the same seeds (docs: serving.md).

    Parameters
    ----------
    logits : Tensor
        ``[..., V]`` float.
    bitmask : Tensor
        ``[..., W]`` int32 with the same leading dimensions, ``W = ceil(V / 32)``.

    Returns
    -------
    Tensor
        ``[..., V]``, the dtype of ``logits``: a new tensor.

    Raises
    ------
    ValueError
        The leading dimensions differ, or the width is not ``ceil(V / 32)`` (both named).

    Examples
    --------
    >>> import torch
    >>> apply_bitmask_reference(torch.zeros(1, 3), torch.tensor([[0b101]], dtype=torch.int32))
    tensor([[0., -inf, 0.]])
    """
    if bitmask.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"bitmask {list(bitmask.shape)} and logits {list(logits.shape)} must have the same "
            "leading dimensions"
        )
    allowed = allowed_from_bitmask(bitmask, logits.shape[-1]).to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))


# ------------------------------------------------------------------------------ tokenizer info
def tokenizer_info(model_or_tokenizer, *, vocab_size: int | None = None, stop_token_ids=None):
    """The ``xgrammar.TokenizerInfo`` of a model's vocabulary, to compile grammars with.

    Parameters
    ----------
    model_or_tokenizer
        - one of this package's byte-level models (a :class:`~specdec_kernels.models.CausalLM`
          from :func:`~specdec_kernels.models.load_bundled`, or anything with a ``config``
          whose ``eos_token_id`` is 256 and ``vocab_size >= 257``): token ``i < 256`` is the
          single byte ``i``, 256 is ``<eos>``, the stop token; ids past 256 (padding of the
          logits) are never allowed;
        - a ``transformers`` tokenizer (anything with ``get_vocab``), through
          ``xgrammar.TokenizerInfo.from_huggingface``;
        - an ``xgrammar.TokenizerInfo``, returned as is.
    vocab_size : int, optional
        The width ``V`` of the model's logits, which is the vocabulary of the bitmasks. Byte-level
        models: default ``config.vocab_size``. Tokenizers: default the tokenizer's size; pass
        the model's ``config.vocab_size`` when its LM head is padded past the tokenizer.
    stop_token_ids : int or list of int, optional
        Tokenizers only: the tokens that end the grammar (default the tokenizer's eos).

    Returns
    -------
    xgrammar.TokenizerInfo

    Raises
    ------
    ValueError
        A model that is not byte-level (pass its tokenizer instead), or a bad ``vocab_size``.
    ImportError
        xgrammar is not installed (the extra ``specdec-kernels[grammar]``).

    Examples
    --------
    >>> from specdec_kernels.models import load_bundled
    >>> info = tokenizer_info(load_bundled("tiny")[0])
    >>> info.vocab_size, info.stop_token_ids
    (257, [256])
    """
    xgr = _xgr()
    if isinstance(model_or_tokenizer, xgr.TokenizerInfo):
        return model_or_tokenizer
    if hasattr(model_or_tokenizer, "get_vocab"):  # a transformers tokenizer
        return xgr.TokenizerInfo.from_huggingface(
            model_or_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
    config = getattr(model_or_tokenizer, "config", None)
    eos = getattr(config, "eos_token_id", None)
    width = getattr(config, "vocab_size", None) if vocab_size is None else vocab_size
    if eos != EOS_ID or not isinstance(width, int) or width < EOS_ID + 1:
        raise ValueError(
            f"model_or_tokenizer: a {type(model_or_tokenizer).__name__} with "
            f"vocab_size={width!r} and eos_token_id={eos!r} is not one of this package's "
            f"byte-level models (vocab_size >= {EOS_ID + 1}, eos_token_id={EOS_ID}); for a "
            "transformers model pass its tokenizer"
        )
    return byte_level_tokenizer_info(width)


def byte_level_tokenizer_info(vocab_size: int = EOS_ID + 1):
    """The ``xgrammar.TokenizerInfo`` of the byte-level vocabulary: 256 bytes, then ``<eos>``
    (the stop token), then ``vocab_size - 257`` padding ids that are never allowed.

    >>> byte_level_tokenizer_info(288).vocab_size
    288
    """
    if not isinstance(vocab_size, int) or vocab_size < EOS_ID + 1:
        raise ValueError(f"vocab_size must be an int >= {EOS_ID + 1}, got {vocab_size!r}")
    xgr = _xgr()
    vocab = [bytes([i]) for i in range(NUM_BYTES)] + [b"<eos>"]
    return xgr.TokenizerInfo(
        vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[EOS_ID]
    )


# ------------------------------------------------------------------------------------- compile
def _compiler(info):
    xgr = _xgr()
    if isinstance(info, xgr.GrammarCompiler):
        return info
    if not isinstance(info, xgr.TokenizerInfo):
        raise ValueError(
            "info must be an xgrammar.TokenizerInfo (see tokenizer_info) or an "
            f"xgrammar.GrammarCompiler, got {type(info).__name__}"
        )
    return xgr.GrammarCompiler(info, max_threads=1)


_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[13:05:49] /project/cpp/x.cc:94: "


def _compile(argument: str, what: str, compile_fn, value):
    """``compile_fn(value)``, with xgrammar's error for a bad grammar as a ``ValueError``
    naming ``argument``."""
    try:
        return compile_fn(value)
    except (RuntimeError, ValueError, TypeError) as exc:
        message = _LOG_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc) else "")
        raise ValueError(f"{argument} is not a valid {what}: {message}") from exc


def compile_json(info, schema=None, **options):
    """Compile JSON: any JSON value (xgrammar's builtin JSON grammar) or one that a JSON schema
    accepts.

    Parameters
    ----------
    info : xgrammar.TokenizerInfo or xgrammar.GrammarCompiler
        From :func:`tokenizer_info`; pass a compiler to reuse its cache over many grammars.
    schema : str, dict or pydantic model class, optional
        A JSON schema; ``None``: the builtin JSON grammar (an object or an array at the top).
    **options
        Keywords of ``xgrammar.GrammarCompiler.compile_json_schema`` (``any_whitespace``,
        ``indent``, ``separators``, ``strict_mode``, ...); only with ``schema``.

    Returns
    -------
    xgrammar.CompiledGrammar

    Raises
    ------
    ValueError
        ``schema`` is not valid JSON or not a schema xgrammar supports (the message names it).

    Examples
    --------
    >>> info = byte_level_tokenizer_info()
    >>> compiled = compile_json(info, {"type": "object", "properties": {"a": {"type": "integer"}}})
    >>> compile_json(info, "{not json")
    Traceback (most recent call last):
    ...
    ValueError: schema is not a valid JSON schema: ...
    """
    compiler = _compiler(info)
    if schema is None:
        if options:
            raise ValueError(f"options {sorted(options)} apply to a schema; schema is None")
        return compiler.compile_builtin_json_grammar()
    return _compile(
        "schema", "JSON schema", lambda s: compiler.compile_json_schema(s, **options), schema
    )


def compile_grammar(info, ebnf: str, *, root_rule_name: str = "root"):
    """Compile a grammar in xgrammar's EBNF (GBNF, llama.cpp's format), whose start rule is
    ``root_rule_name``.

    Parameters
    ----------
    info : xgrammar.TokenizerInfo or xgrammar.GrammarCompiler
    ebnf : str
        E.g. ``'root ::= "yes" | "no"'``.

    Returns
    -------
    xgrammar.CompiledGrammar

    Raises
    ------
    ValueError
        ``ebnf`` is not a string or does not parse (the message names it and says where).

    Examples
    --------
    >>> compiled = compile_grammar(byte_level_tokenizer_info(), 'root ::= "yes" | "no"')
    >>> compile_grammar(byte_level_tokenizer_info(), 'root ::= (')
    Traceback (most recent call last):
    ...
    ValueError: ebnf is not a valid EBNF grammar: EBNF parser error at line 1, column ...
    """
    if not isinstance(ebnf, str):
        raise ValueError(f"ebnf must be a str, got {type(ebnf).__name__}")
    compiler = _compiler(info)
    return _compile(
        "ebnf",
        "EBNF grammar",
        lambda g: compiler.compile_grammar(g, root_rule_name=root_rule_name),
        ebnf,
    )


def compile_regex(info, regex: str):
    """Compile a regular expression (the whole output must match it).

    Parameters
    ----------
    info : xgrammar.TokenizerInfo or xgrammar.GrammarCompiler
    regex : str
        E.g. ``r"[0-9]{3}-[0-9]{4}"``.

    Returns
    -------
    xgrammar.CompiledGrammar

    Raises
    ------
    ValueError
        ``regex`` is not a string or does not parse (the message names it).

    Examples
    --------
    >>> compiled = compile_regex(byte_level_tokenizer_info(), r"[0-9]+")
    >>> compile_regex(byte_level_tokenizer_info(), "(")
    Traceback (most recent call last):
    ...
    ValueError: regex is not a valid regular expression: ...
    """
    if not isinstance(regex, str):
        raise ValueError(f"regex must be a str, got {type(regex).__name__}")
    compiler = _compiler(info)
    return _compile("regex", "regular expression", compiler.compile_regex, regex)


# ------------------------------------------------------------------------------ per-row state
class GrammarState:
    """One xgrammar matcher per batch row: the bitmasks of a step and the commit of its tokens.

    The host side of grammar-constrained speculative decoding (xgrammar runs on the CPU): a
    step fills the masks of its draft positions, the verification ops apply them inside the
    kernels (``token_bitmask=``), then :meth:`advance` commits the emitted tokens. Filling reads
    the draft tokens to the host (one transfer per call); the masks go back to ``device`` in one
    copy.

    Parameters
    ----------
    grammar : xgrammar.CompiledGrammar or sequence of them
        One grammar for every row, or one per row (``batch_size`` of them).
    batch_size : int
        ``B``.
    vocab_size : int
        ``V``: the width of the logits the masks go with; every grammar's tokenizer info must
        have this vocabulary size.
    device : str or torch.device
        Where the returned masks and :attr:`terminated` live.

    Raises
    ------
    ValueError
        A list of the wrong length, something that is not a compiled grammar, or a vocabulary
        mismatch (the message names both sizes).

    Notes
    -----
    A row whose matcher has terminated (accepted the stop token) or, during a draft walk, met a
    draft token its grammar rejects, gets all-allowed masks (``-1`` words) from then on: those
    positions are never decided by verification (the rejected draft is rejected by its own
    position's mask; a terminated row is done).

    Examples
    --------
    >>> import torch
    >>> compiled = compile_regex(byte_level_tokenizer_info(), "ab")
    >>> state = GrammarState(compiled, batch_size=1, vocab_size=257)
    >>> masks = state.fill_draft_bitmasks(torch.tensor([[97, 98]]))  # [1, K+1 = 3, W = 9]
    >>> allowed = allowed_from_bitmask(masks, 257)
    >>> [row.nonzero().flatten().tolist() for row in allowed[0]]  # 'a', then 'b', then <eos>
    [[97], [98], [256]]
    >>> state.advance(torch.tensor([[97, 98, 256]])).tolist()  # the row is done
    [True]
    """

    def __init__(self, grammar, batch_size: int, vocab_size: int, device="cpu"):
        xgr = _xgr()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        grammars = _per_row(grammar, batch_size, xgr.CompiledGrammar)
        for b, g in enumerate(grammars):
            if g.tokenizer_info.vocab_size != vocab_size:
                raise ValueError(
                    f"vocabulary mismatch: grammar {b} was compiled for a vocabulary of "
                    f"{g.tokenizer_info.vocab_size} tokens, but vocab_size (the logits' V) is "
                    f"{vocab_size}"
                )
        self.vocab_size, self.width = vocab_size, bitmask_width(vocab_size)
        self.device = torch.device(device)
        self.matchers = [xgr.GrammarMatcher(g) for g in grammars]
        self._pending = [0] * batch_size  # drafts pushed per row since the last discard
        self._stalled = [False] * batch_size  # a pushed draft was rejected
        #: ``[B]`` int64 (host): grammar-valid drafts per row in the last draft walk.
        self.num_valid_drafts = torch.zeros(batch_size, dtype=torch.int64)
        #: ``[B]`` int64 (host): tokens each row's matcher took in the last :meth:`advance`.
        self.num_advanced = torch.zeros(batch_size, dtype=torch.int64)

    @property
    def batch_size(self) -> int:
        return len(self.matchers)

    @property
    def terminated(self) -> torch.Tensor:
        """``[B]`` bool on ``device``: rows whose grammar has accepted its stop token."""
        done = [m.is_terminated() for m in self.matchers]
        return torch.tensor(done, dtype=torch.bool).to(self.device)

    # -------------------------------------------------------------------- masks of a step
    def _fill(self, out: torch.Tensor, b: int, j: int) -> None:
        """``out[b, j]`` = row ``b``'s mask at its matcher's current state."""
        m = self.matchers[b]
        if not m.is_terminated():
            m.fill_next_token_bitmask(out[b], j)

    def fill_draft_bitmasks(self, draft_tokens, num_draft_tokens=None) -> torch.Tensor:
        """The masks of every draft position: what ``token_bitmask=`` of ``verify_greedy`` /
        ``verify_sampling`` takes.

        Position ``j``'s mask is the row's mask after its committed tokens and drafts
        ``0 .. j-1``; position ``k_b`` is the bonus token's. Each matcher walks along its row's
        draft and is rolled back to where it was. A draft token the grammar rejects stops the
        walk: its own position's mask (which disallows it) is exact, later positions are
        all-allowed (never decided: verification rejects that draft). The same after a draft
        that is the stop token (the row would be done).

        Parameters
        ----------
        draft_tokens : Tensor
            ``[B, K]`` int; entries ``>= num_draft_tokens[b]`` are padding.
        num_draft_tokens : Tensor, optional
            ``[B]`` int, default ``K``.

        Returns
        -------
        Tensor
            ``[B, K+1, W]`` int32 on ``device``. :attr:`num_valid_drafts` holds, per row, the
            drafts the grammar accepted.

        Raises
        ------
        ValueError
            Wrong shapes, or drafts pushed by :meth:`push_drafts` not yet discarded.
        """
        self._check_no_pending("fill_draft_bitmasks")
        drafts, counts = self._drafts(draft_tokens, num_draft_tokens)
        k = draft_tokens.shape[1]
        out = torch.full((self.batch_size, k + 1, self.width), -1, dtype=torch.int32)
        valid = []
        for b, m in enumerate(self.matchers):
            self._fill(out, b, 0)
            walked = 0
            for j in range(counts[b]):
                if m.is_terminated() or not m.accept_token(drafts[b][j]):
                    break
                walked += 1
                self._fill(out, b, j + 1)
            m.rollback(walked)
            valid.append(walked)
        self.num_valid_drafts = torch.tensor(valid, dtype=torch.int64)
        return out.to(self.device)

    def fill_tree_bitmasks(self, tree_tokens, parents, num_nodes=None) -> torch.Tensor:
        """The masks of every node of a token tree per row (the layout of docs: trees.md): what
        ``token_bitmask=`` of ``verify_tree_greedy`` / ``verify_tree_sampling`` takes.

        Node ``i``'s mask is the row's mask after its committed tokens and the draft tokens on
        the path from the root (node 0, no draft) down to ``i``, ``i`` included: the mask of
        the token after node ``i``. A node whose path holds a token the grammar rejects (or the
        stop token) gets an all-allowed mask (never decided: verification rejects that token).

        Parameters
        ----------
        tree_tokens : Tensor
            ``[B, N]`` int (entry 0 ignored).
        parents : Tensor
            ``[B, N]`` int, ``parents[b, i] < i``, root ``-1``.
        num_nodes : Tensor, optional
            ``[B]`` int, default ``N``; nodes past it are padding (all-allowed masks).

        Returns
        -------
        Tensor
            ``[B, N, W]`` int32 on ``device``.
        """
        self._check_no_pending("fill_tree_bitmasks")
        tokens, counts = self._drafts(tree_tokens, num_nodes, "tree_tokens", "num_nodes")
        if parents.shape != tree_tokens.shape:
            raise ValueError(
                f"parents {list(parents.shape)} must have tree_tokens' shape "
                f"{list(tree_tokens.shape)}"
            )
        par = parents.tolist()
        out = torch.full((self.batch_size, tree_tokens.shape[1], self.width), -1, dtype=torch.int32)
        for b, m in enumerate(self.matchers):
            n = counts[b]
            children: list[list[int]] = [[] for _ in range(n)]
            for i in range(1, n):
                if not 0 <= par[b][i] < i:
                    raise ValueError(f"parents[{b}, {i}] = {par[b][i]} is not in [0, {i})")
                children[par[b][i]].append(i)
            self._fill(out, b, 0)
            stack = [(c, False) for c in reversed(children[0])]  # (node, leaving)
            while stack:
                node, leaving = stack.pop()
                if leaving:
                    m.rollback(1)
                    continue
                if m.is_terminated() or not m.accept_token(tokens[b][node]):
                    continue  # this subtree keeps its all-allowed masks
                self._fill(out, b, node)
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(children[node]))
        return out.to(self.device)

    # ------------------------------------------------------- drafting one token at a time
    def mask_for_next(self) -> torch.Tensor:
        """``[B, W]`` int32 on ``device``: each row's mask for its next token, after its
        committed tokens and the drafts pushed by :meth:`push_drafts` since the last
        :meth:`discard_drafts` (all-allowed for a terminated row, or one whose pushed draft
        was rejected). The drafter masks its distribution with it before drawing draft
        ``j``; the masks of positions ``0 .. K`` so drawn are the ones
        :meth:`fill_draft_bitmasks` gives for the same drafts."""
        out = torch.full((self.batch_size, 1, self.width), -1, dtype=torch.int32)
        for b in range(self.batch_size):
            if not self._stalled[b]:
                self._fill(out, b, 0)
        return out[:, 0].to(self.device)

    def push_drafts(self, tokens, active=None) -> None:
        """Advance each row's matcher by one draft token, tentatively (until
        :meth:`discard_drafts`).

        Parameters
        ----------
        tokens : Tensor
            ``[B]`` int: the draft drawn for each row.
        active : Tensor, optional
            ``[B]`` bool: rows that drafted (default all); the others are left as they are.
        """
        toks = _host_list(tokens, "tokens", (self.batch_size,))
        act = (
            [True] * self.batch_size
            if active is None
            else _host_list(active, "active", (self.batch_size,))
        )
        for b, m in enumerate(self.matchers):
            if not act[b] or self._stalled[b]:
                continue
            if not m.is_terminated() and m.accept_token(toks[b]):
                self._pending[b] += 1
            else:
                self._stalled[b] = True

    def discard_drafts(self) -> None:
        """Roll every matcher back past the drafts pushed since the last call."""
        for b, m in enumerate(self.matchers):
            m.rollback(self._pending[b])
        self._pending = [0] * self.batch_size
        self._stalled = [False] * self.batch_size

    # ------------------------------------------------------------------------ commit
    def advance(self, tokens, num_tokens=None) -> torch.Tensor:
        """Commit the emitted tokens: each matcher accepts its row's first ``num_tokens[b]``
        tokens, up to and including the stop token (what follows it is ignored).

        Parameters
        ----------
        tokens : Tensor
            ``[B, T]`` int: the emitted tokens (``Verification.tokens``, cut where the loop cuts
            them: a row's budget or eos).
        num_tokens : Tensor, optional
            ``[B]`` int, default ``T``.

        Returns
        -------
        Tensor
            ``[B]`` bool on ``device``: rows whose grammar has terminated (done, as at eos).
            :attr:`num_advanced` holds, per row, the tokens taken (the stop token included):
            where the loop cuts a row whose grammar ended.

        Raises
        ------
        ValueError
            A token the row's grammar does not allow (named with row and position): the
            tokens were not generated under these masks. Every matcher is then left where it
            was before the call.
        """
        self._check_no_pending("advance")
        toks, counts = self._drafts(tokens, num_tokens, "tokens", "num_tokens")
        taken = [0] * self.batch_size
        for b, m in enumerate(self.matchers):
            for j in range(counts[b]):
                if m.is_terminated():
                    break
                if not m.accept_token(toks[b][j]):
                    for row, n in enumerate(taken):
                        self.matchers[row].rollback(n)
                    raise ValueError(
                        f"row {b}: token {toks[b][j]} at position {j} is not allowed by its grammar"
                    )
                taken[b] += 1
        #: ``[B]`` int64 (host): tokens each row's matcher took in the last :meth:`advance`.
        self.num_advanced = torch.tensor(taken, dtype=torch.int64)
        return self.terminated

    def select(self, order) -> None:
        """Keep rows ``order`` (a list or ``[B']`` int tensor), in that order, as the decoding
        loop does when it retires rows."""
        order = order.tolist() if isinstance(order, torch.Tensor) else list(order)
        self._check_no_pending("select")
        self.matchers = [self.matchers[i] for i in order]
        self._pending = [0] * len(order)
        self._stalled = [False] * len(order)
        self.num_valid_drafts = self.num_valid_drafts[order]
        self.num_advanced = self.num_advanced[order]

    # ------------------------------------------------------------------------ checks
    def _check_no_pending(self, what: str) -> None:
        if any(self._pending) or any(self._stalled):
            raise ValueError(f"{what}: drafts pushed by push_drafts; call discard_drafts first")

    def _drafts(self, tokens, counts, name="draft_tokens", count_name="num_draft_tokens"):
        """``tokens [B, K]`` and ``counts [B]`` (default ``K``) as host lists, checked."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise ValueError(f"{name} must be a [B, K] tensor, got {_shape(tokens)}")
        if tokens.shape[0] != self.batch_size:
            raise ValueError(
                f"{name} {list(tokens.shape)} has {tokens.shape[0]} rows, the state "
                f"{self.batch_size}"
            )
        k = tokens.shape[1]
        if counts is None:
            n = [k] * self.batch_size
        else:
            n = _host_list(counts, count_name, (self.batch_size,))
            if any(not 0 <= c <= k for c in n):
                raise ValueError(f"{count_name} must be in [0, {k}], got {n}")
        return tokens.tolist(), n


def _per_row(grammar, batch_size: int, compiled_type) -> list:
    if isinstance(grammar, compiled_type):
        return [grammar] * batch_size
    if not isinstance(grammar, Sequence) or isinstance(grammar, str):
        raise ValueError(
            "grammar must be an xgrammar.CompiledGrammar or a list of them (compile_json, "
            f"compile_grammar, compile_regex), got {type(grammar).__name__}"
        )
    if len(grammar) != batch_size:
        raise ValueError(f"grammar has {len(grammar)} entries for batch_size={batch_size} rows")
    for b, g in enumerate(grammar):
        if not isinstance(g, compiled_type):
            raise ValueError(
                f"grammar[{b}] must be an xgrammar.CompiledGrammar, got {type(g).__name__}"
            )
    return list(grammar)


def _host_list(x, name: str, shape: tuple) -> list:
    t = torch.as_tensor(x)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    return t.tolist()


def _shape(x) -> str:
    return str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


__all__ = [
    "GrammarState",
    "allowed_from_bitmask",
    "apply_bitmask_reference",
    "bitmask_width",
    "byte_level_tokenizer_info",
    "compile_grammar",
    "compile_json",
    "compile_regex",
    "tokenizer_info",
]
