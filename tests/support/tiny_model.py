"""Builds a tiny random-weight Llama and a locally trained tokenizer for the real-vLLM tests.

Run it with the vLLM environment's Python (it needs torch, transformers and tokenizers, which the
project's own .venv does not have):

    .venv-vllm/bin/python tests/support/tiny_model.py OUTDIR

Why a model of our own: the tests need a real engine (continuous batching, a KV cache that
fills, preemption, vLLM's metrics), not real text, and nothing may be fetched from a model hub.
A 2-layer Llama with hidden size 64 loads in a second and decodes fast on two CPU cores.

Two choices make the engine's behaviour predictable for tests that count tokens:

* The vocabulary is ASCII only, so every ordinary token decodes to at least one whole character:
  vLLM's incremental detokenizer never holds a token back waiting for the rest of a UTF-8
  sequence, so a stream carries one text delta per generated token.
* The special tokens (``<s>``, ``</s>``, ``<pad>``, ``<unk>``) can never be sampled. Random
  weights would otherwise emit ``</s>`` now and then and end a request before ``max_tokens``
  (or emit an empty delta). Every embedding has one large constant component, which survives the
  small random residual updates and the final RMSNorm as a positive feature; the LM-head rows of
  the special tokens weigh that feature with a large negative number. So a request always runs
  to ``max_tokens``, with or without ``ignore_eos``.

The output directory also gets ``fleetwarden-tiny.json`` with facts the tests rely on: the filler
word that is exactly one token however often it is repeated, and the special token ids.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB_SIZE = 1024
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2  # head size 32: the smallest the CPU attention backend supports
NUM_KV_HEADS = 2
INTERMEDIATE_SIZE = 128
MAX_POSITIONS = 4096
FILLER_WORD = "fill"  # " fill" is one token; prompts of an exact length repeat it
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, in this order
ANCHOR_VALUE = 8.0  # the constant embedding component that keeps special tokens unsampled
SPECIAL_LOGIT_WEIGHT = -1000.0

# A plain-ASCII chat template: roles as text, every message closed by </s>, so a prompt renders
# the same way whatever the engine's version.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_WORD_TEXT = (
    "the a an of to in on at for with from by is are was be this that it its as and or not "
    "request token tenant engine queue cache batch model serve fair share user system prompt "
    "answer stream chunk first latency budget weight counter policy schedule admit throttle "
    "hello world fleet warden sidecar proxy metric usage prefill decode block page memory "
    "zero one two three four five six seven eight nine ten"
)
_WORDS = _WORD_TEXT.split()


def _corpus(rng: random.Random) -> list[str]:
    """Deterministic ASCII training text: common words, the filler word, and invented words.

    Invented words made of random letters give the BPE trainer many merges to learn, so the
    vocabulary fills up to ``VOCAB_SIZE`` with multi-character tokens.
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    invented = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(3000)]
    lines = []
    for _ in range(4000):
        words = [rng.choice(_WORDS) if rng.random() < 0.6 else rng.choice(invented)]
        words += [rng.choice(_WORDS + invented) for _ in range(rng.randint(4, 14))]
        words.append(FILLER_WORD)
        lines.append(" ".join(words) + rng.choice([".", ",", "?", "!", ":"]))
    lines.append(" ".join([FILLER_WORD] * 200))
    return lines


def build_tokenizer(outdir: Path, rng: random.Random) -> Any:
    """Trains a byte-level BPE on ASCII text and saves it as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Only printable ASCII (and newline/tab) as the base alphabet: no token is a lone byte of a
    # multi-byte character. Anything else in a prompt becomes <unk>.
    byte_to_char = pre_tokenizers.ByteLevel.alphabet()
    ascii_alphabet = [c for c in sorted(byte_to_char) if _is_ascii_char(c)]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=ascii_alphabet,
        limit_alphabet=len(ascii_alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    # Completions get a BOS like a real Llama; chat prompts carry it through the template.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(outdir)
    return fast


def _is_ascii_char(mapped: str) -> bool:
    """Whether a ByteLevel alphabet character stands for a printable ASCII byte or whitespace.

    ByteLevel maps each byte to a printable character; the bytes 33..126 map to themselves and
    space, tab and newline to other characters, which we recover through the inverse table.
    """
    return _BYTE_OF.get(mapped, 255) in _ASCII_BYTES


_ASCII_BYTES = {9, 10, *range(32, 127)}


def _byte_of_table() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table (what the ByteLevel pre-tokenizer uses)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF = _byte_of_table()


def build_model(outdir: Path, tokenizer: Any) -> None:
    """Creates the random Llama, plants the anchor that mutes special tokens, and saves it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.02,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    special_ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = ANCHOR_VALUE
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[special_ids, 0] = SPECIAL_LOGIT_WEIGHT
    model.generation_config.do_sample = True
    model.save_pretrained(outdir, safe_serialization=True)
    _check_special_tokens_muted(model, tokenizer, special_ids)


def _check_special_tokens_muted(model: Any, tokenizer: Any, special_ids: list[int]) -> None:
    """Fails the build if any special token could win against an ordinary one."""
    import torch

    ids = tokenizer(" ".join([FILLER_WORD] * 64) + " hello world", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0]
    ordinary = torch.ones(logits.shape[-1], dtype=torch.bool)
    ordinary[special_ids] = False
    margin = logits[:, ordinary].min(dim=-1).values - logits[:, special_ids].max(dim=-1).values
    if float(margin.min()) < 100.0:
        raise RuntimeError(f"special tokens are not muted: logit margin {float(margin.min())}")


def _check_filler(tokenizer: Any) -> None:
    """The tests build prompts of an exact length from the filler word: make sure they can."""
    for n in (1, 2, 7, 100, 1000):
        text = " ".join([FILLER_WORD] * n)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != n:
            raise RuntimeError(f"{n} filler words encode to {len(ids)} tokens, not {n}")
        if tokenizer.decode(ids) != text:
            raise RuntimeError("the filler text does not round-trip through the tokenizer")
    with_bos = tokenizer("hello", add_special_tokens=True)["input_ids"]
    if with_bos[0] != tokenizer.bos_token_id:
        raise RuntimeError("the tokenizer does not add <s> to a completion prompt")


def build(outdir: Path) -> dict[str, Any]:
    """Builds tokenizer, model and the facts file into ``outdir``; returns the facts."""
    outdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    tokenizer = build_tokenizer(outdir, rng)
    _check_filler(tokenizer)
    build_model(outdir, tokenizer)
    facts = {
        "filler_word": FILLER_WORD,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": MAX_POSITIONS,
        "seed": SEED,
    }
    (outdir / "fleetwarden-tiny.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def main(argv: list[str]) -> int:
    """Command-line entry: one argument, the output directory."""
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    facts = build(Path(argv[1]))
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
