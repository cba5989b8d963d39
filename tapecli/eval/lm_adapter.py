"""A native lm-evaluation-harness model over tape's model core, registered in lm-eval as `tape`.

Contract (lm-eval's `TemplateLM`, see docs/contracts.md):
    TapeLM(pretrained="runs/x" | checkpoint dir | HF dir or id, dtype="auto", device="auto", batch_size=1,
           max_length=None, max_gen_toks=256, add_bos_token=None, prefix_token_id=None, seed=1234, pe_args=None)
    TapeLM.from_opened(opened, **same options)               # a model opened by tapecli.store.door.open_model
    lm.loglikelihood(requests) -> [(logprob, is_greedy)]     # via TemplateLM's pair encoding + _loglikelihood_tokens
    lm.loglikelihood_rolling(requests) -> [logprob]          # disjoint max_length windows, as lm-eval's HF model
    lm.generate_until(requests) -> [str]                     # stop strings, max_gen_toks, greedy or seeded sampling

Every request is scored the way lm-eval's own `hf` model (`HFLM`) scores it, so that a Hugging Face Llama imported
into tape gives the same per-sample numbers as `HFLM` on the same directory (tests/eval/test_harness.py and
tests/eval/test_special_tokens.py check it):
  - tokens (lm-eval 0.4.13's `HFLM.tok_encode` / `tok_batch_encode`, docs/special-tokens.md): the model's own
    tokenizer with its default special tokens (`Tokenizer.encode(text, add_special_tokens=True)`: what transformers'
    AutoTokenizer adds for a Hugging Face model, BOS for tape's own tokenizers) unless `add_bos_token` is given:
    True puts BOS (if the tokenizer has one) and nothing else around every string, False adds nothing. A string
    that already starts with the prefix token's text (e.g. "<s>") gets no special tokens; for generation the
    batch's first prompt decides, as in HFLM. The prefix token for empty contexts and rolling windows is
    `prefix_token_id`, else BOS, else (a tokenizer without BOS) EOS; the end-of-text token is EOS;
  - loglikelihood: requests sorted longest first and grouped by context with lm-eval's `Collator`; context +
    continuation truncated from the left to max_length + 1 tokens; right-padded batches (exact under causal
    attention: a position's logits depend only on the tokens up to it, for every tape PE); `is_greedy` is whether
    the argmax at every continuation position equals the continuation;
  - loglikelihood_rolling: `lm_eval.utils.get_rolling_token_windows` + `make_disjoint_window` with context_len=1;
  - generate_until: `normalize_gen_kwargs` (default max_gen_toks 256), prompts left-truncated to
    max_length - max_gen_toks, a row stops at EOS or once its text holds a stop string, text cut at the first
    stop string (`postprocess_generated_text`).
  - generation batches: longest first (lm-eval's `Collator`, grouped by generation settings), left-padded and
    masked by `tapecli.eval.common.generate_batch`, KV cache; sampling draws from one generator seeded with
    `seed` + the batch's index, so a command repeated gives the same samples (another batch size gives others).
Padding and generation go through the two small functions `_forward_padded` and `_generate`, the only places that
know how tape batches sequences of different lengths.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from tapecli.errors import TapeError
from tapecli.eval.common import generate_batch

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from tapecli.store.door import OpenedModel

# The lm-eval versions this adapter is written and tested against; pyproject.toml states the same range (a test checks).
LM_EVAL_RANGE = ">=0.4.10,<0.5"


def check_lm_eval_version(installed: str | None = None) -> str:
    """The installed lm-eval version, or a TapeError naming the supported range when it is outside it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if installed is None:
        try:
            installed = version("lm_eval")
        except PackageNotFoundError:
            raise TapeError(f"lm-eval is not installed; pip install 'lm-eval{LM_EVAL_RANGE}'") from None
    try:
        supported = Version(installed) in SpecifierSet(LM_EVAL_RANGE, prereleases=True)
    except InvalidVersion:
        supported = False
    if not supported:
        raise TapeError(f"lm-eval {installed} is not supported; tape's harness model needs lm-eval{LM_EVAL_RANGE} "
                        f"(pip install 'lm-eval{LM_EVAL_RANGE}')")
    return installed


def _int_option(name: str, value: Any) -> int:
    """lm-eval's CLI hands model arguments over as strings (`batch_size=8`): accept ints and digit strings."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise TapeError(f"{name}={value!r}: expected a positive integer") from None
    if number <= 0:
        raise TapeError(f"{name}={value!r}: expected a positive integer")
    return number


def _token_id_option(name: str, value: Any, vocab_size: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if not 0 <= number < vocab_size:
        raise TapeError(f"{name}={value!r}: expected a token id between 0 and {vocab_size - 1}")
    return number


def _bool_option(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise TapeError(f"{name}={value!r}: expected true or false")


@register_model("tape")
class TapeLM(TemplateLM):
    """lm-eval's view of a tape model: loglikelihood, rolling loglikelihood and generation (see module docstring)."""

    def __init__(self, pretrained: str | None = None, dtype: str = "auto", device: str | None = "auto",
                 batch_size: int | str = 1, max_batch_size: int | None = None, max_length: int | str | None = None,
                 max_gen_toks: int | str = 256, add_bos_token: bool | str | None = None,
                 prefix_token_id: int | str | None = None, seed: int | str = 1234,
                 pe_args: dict[str, Any] | str | None = None, opened: OpenedModel | None = None,
                 **unused: Any) -> None:
        super().__init__()
        check_lm_eval_version()
        if unused:
            raise TapeError(f"unknown tape model argument(s) {', '.join(sorted(unused))}; allowed: pretrained, "
                            "dtype, device, batch_size, max_length, max_gen_toks, add_bos_token, prefix_token_id, "
                            "seed, pe_args")
        if str(batch_size) == "auto" or str(batch_size).startswith("auto:"):
            raise TapeError("batch_size=auto is not supported by the tape model; pass a number, e.g. batch_size=8")
        if opened is None:
            if not pretrained:
                raise TapeError("the tape model needs pretrained=RUN (a tape run, checkpoint, or Hugging Face "
                                "directory or id)")
            from tapecli.eval.common import parse_pe_args
            from tapecli.store.door import open_model

            if isinstance(pe_args, str):  # from lm-eval's CLI: pe_args=scaling=linear;factor=2
                pe_args = parse_pe_args([pair for pair in pe_args.split(";") if pair])
            opened = open_model(str(pretrained), dtype=dtype or "auto", device=device or "auto", pe_args=pe_args)
        self.opened = opened
        self.model, self.tok = opened.model, opened.tokenizer
        self._device = next(self.model.parameters()).device
        self._batch_size = _int_option("batch_size", batch_size)
        self._max_length = (self.model.config.max_seq_len if max_length in (None, "", "None")
                            else _int_option("max_length", max_length))
        self._max_gen_toks = _int_option("max_gen_toks", max_gen_toks)
        # None: the tokenizer's default special tokens (lm-eval's HFLM with add_bos_token unset)
        self.add_bos_token = None if add_bos_token is None else _bool_option("add_bos_token", add_bos_token)
        self.custom_prefix_token_id = None if prefix_token_id is None else _token_id_option(
            "prefix_token_id", prefix_token_id, self.tok.vocab_size)
        self.seed = int(seed)

    @classmethod
    def from_opened(cls, opened: OpenedModel, **options: Any) -> TapeLM:
        """Wrap a model already opened with `tapecli.store.door.open_model`."""
        return cls(opened=opened, **options)

    # --- what lm-eval asks of every model -----------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        return self.tok.bos_id if self.tok.has_bos else self.tok.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return type(self.tok).__name__

    def settings(self) -> dict[str, Any]:
        """What determines this model's answers (recorded under `config` in lm-eval's results)."""
        return {**self.opened.record(), "max_length": self.max_length, "max_gen_toks": self.max_gen_toks,
                "add_bos_token": self.add_bos_token, "special_tokens": self.special_tokens(), "seed": self.seed}

    def special_tokens(self) -> dict[str, Any]:
        """What is put around every string (one that does not start with the prefix token), and the prefix token."""
        before, after = self._specials(add=None)
        return {**self.tok.describe_specials(before, after), "prefix_token": self.tok.token_name(self.prefix_token_id)}

    def get_model_info(self) -> dict[str, Any]:
        return self.settings()

    def _specials(self, add: bool | None) -> tuple[list[int], list[int]]:
        """(ids before, ids after) a string, as HFLM's tokenizer gets them with `add_special_tokens=add` (None: the
        tokenizer's default). An HFLM given add_bos_token creates its tokenizer with it, which makes transformers
        rebuild the post-processor: BOS (when the tokenizer has one) before the text, nothing after it."""
        if add is False:
            return [], []
        if self.add_bos_token is None:
            return self.tok.default_specials
        return ([self.tok.bos_id] if self.add_bos_token and self.tok.has_bos else []), []

    def _encode(self, string: str, add: bool | None) -> list[int]:
        before, after = self._specials(add)
        return [*before, *self.tok.encode(string), *after]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        """HFLM.tok_encode: `add_special_tokens`, else add_bos_token, else the tokenizer's default; a string that
        starts with the prefix token's text gets none (when `add_special_tokens` is not given)."""
        add = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        prefix_text = self.tok.token_text(self.prefix_token_id)
        if add_special_tokens is None and prefix_text and string.startswith(prefix_text):
            add = False
        ids = self._encode(string, add)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def _encode_prompts(self, contexts: list[str], left_truncate_len: int) -> list[list[int]]:
        """HFLM.tok_batch_encode: the batch's first prompt starting with BOS's text means no special tokens for any
        prompt, else add_bos_token, else the tokenizer's default; each prompt cut from the left."""
        bos_text = self.tok.token_text(self.tok.bos_id) if self.tok.has_bos else None
        add = False if bos_text and contexts[0].startswith(bos_text) else self.add_bos_token
        return [self._encode(context, add)[-left_truncate_len:] for context in contexts]

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    # --- loglikelihood ------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool]] = []
        # Longest first (OOMs show up at once, the first batch fixes the padded length); requests that share
        # context + continuation[:-1] run once (multiple choice with one-token answers).
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                         group_by="contexts", group_fn=lambda r: r[-2] + r[-1][:-1])
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="Running loglikelihood requests")
        for chunk in order.get_batched(n=self.batch_size):
            inputs = []
            for _, context, continuation in chunk:
                if not context or not continuation or len(continuation) > self.max_length:
                    raise TapeError(f"cannot score a continuation of {len(continuation)} tokens after "
                                    f"{len(context)} context tokens with max_length={self.max_length}")
                # The last continuation token is only predicted, never fed in.
                inputs.append((context + continuation)[-(self.max_length + 1):][:-1])
            logprobs = F.log_softmax(self._forward_padded(inputs), dim=-1, dtype=torch.float32)
            for (request, context, continuation), row, tokens in zip(chunk, logprobs, inputs, strict=True):
                scored = row[len(tokens) - len(continuation):len(tokens)].unsqueeze(0)  # [1, cont, vocab]
                greedy = scored.argmax(dim=-1)
                for request_str, cont, lp in order.get_cache(req_str=request, cxt_toks=context,
                                                             cont_toks=continuation, logits=scored):
                    target = torch.tensor(cont, dtype=torch.long, device=lp.device).unsqueeze(0)
                    is_greedy = bool((greedy[:, -target.shape[1]:] == target).all())
                    answer = (float(lp.gather(2, target.unsqueeze(-1)).sum()), is_greedy)
                    results.append(answer)
                    if request_str is not None:  # rolling windows are cached per document instead
                        self.cache_hook.add_partial("loglikelihood", request_str, answer)
                    progress.update(1)
        progress.close()
        return order.get_original(results)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, request in enumerate(requests):
            tokens = self.tok_encode(request.args[0])
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, context, continuation))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owners, scores, strict=True):
            totals[index] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # --- generation ---------------------------------------------------------------------------------------------

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        results: list[str] = []
        order = Collator([r.args for r in requests], sort_fn=lambda a: (-len(self.tok_encode(a[0])), a[0]),
                         group_by="gen_kwargs", group_fn=lambda a: a[1])
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="Running generate_until requests")
        for batch_index, chunk in enumerate(order.get_batched(n=self.batch_size)):
            contexts, all_kwargs = zip(*chunk, strict=True)
            kwargs = normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks)  # one group shares its kwargs
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = kwargs.pop("max_gen_toks")
            if max_new >= self.max_length:
                raise TapeError(f"max_gen_toks={max_new} leaves no room for a prompt with max_length="
                                f"{self.max_length}")
            prompts = self._encode_prompts(list(contexts), left_truncate_len=self.max_length - max_new)
            # Greedy unless do_sample; sampling without a temperature uses 1.0 (transformers' default).
            temperature = float(kwargs.get("temperature") or 1.0) if kwargs.get("do_sample") else 0.0
            outputs = self._generate(prompts, max_new, until, temperature=temperature, top_k=kwargs.get("top_k"),
                                     top_p=kwargs.get("top_p"), seed=self.seed + batch_index)
            for context, gen_kwargs, tokens in zip(contexts, all_kwargs, outputs, strict=True):
                text = postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=None)
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                progress.update(1)
        progress.close()
        return order.get_original(results)

    # --- the model calls ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def _forward_padded(self, sequences: list[list[int]]) -> torch.Tensor:
        """Logits [B, T, V] for right-padded sequences. Under causal attention the logits at a position depend only
        on the tokens up to it, so the padding after a sequence never changes its scores."""
        if not self.model.config.causal:
            raise TapeError("the tape harness model needs a causal model (model.causal=true)")
        longest = max(len(s) for s in sequences)
        padded = torch.tensor([s + [self.tok.pad_id] * (longest - len(s)) for s in sequences], dtype=torch.long,
                              device=self.device)
        return self.model(padded)

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, until: list[str], temperature: float,
                  top_k: int | None, top_p: float | None, seed: int) -> list[list[int]]:
        """The new tokens for each prompt, EOS and what follows it removed. A row stops at EOS or as soon as its
        text holds a stop string (what follows is cut off anyway), so short answers cost few decoding steps."""
        eos = self.tok.eos_id
        stops = [s for s in until if s]
        outputs = generate_batch(self.model, prompts, max_new_tokens, batch_size=self.batch_size, stop_tokens=[eos],
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                 stop_check=(lambda new: any(s in self.tok_decode(new) for s in stops)) if stops
                                 else None)
        return [row[:row.index(eos)] if eos in row else row for row in outputs]
