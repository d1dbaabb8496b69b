"""Build a tiny, deterministic Llama model for the real-vLLM CPU tier: `python build_model.py OUT_DIR`.

Runs with the vLLM venv's python (torch, transformers, tokenizers, safetensors), never with the
project's. No model hub: the weights are random (fixed seed) and the tokenizer is trained here on
generated text, so the same directory comes out byte for byte on every run, in a few seconds.

What the model does: every transformer layer's output projections (attention `o_proj`, MLP
`down_proj`) are zeroed, so the residual stream is just the current token's embedding and the model
is a bigram. The LM head is built so that the successor of each "cycle" token is the next token
of a short cycle (length `CYCLE`), with a logit margin of about 40, and every other token shares a
cycle token's embedding, so it leads into a cycle in one step just as clearly; no row of the head
points at a special token, so output never ends early and it repeats with period `CYCLE` — also
when sampling (n > 1 needs a temperature), which is then as deterministic as greedy. That repetition is what lets n-gram speculative decoding accept drafts. The layers
still run (attention with head_dim 64, which the CPU kernels need), so vLLM does real work.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

SEED = 20260
VOCAB_SIZE = 640
HIDDEN = 128
HEADS = 2  # head_dim = 64: the CPU attention kernels need head_dim >= 64
LAYERS = 2
CYCLE = 5
MAX_POSITIONS = 2048

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<tool_call>", "</tool_call>")
BOS, EOS, PAD = "<s>", "</s>", "<pad>"

# A plain template: role markers as special tokens, the generation prompt opens an assistant turn.
# `content` may be a string or a list of text parts (the Responses API and content arrays send parts).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>{{ '\\n' }}Tools: {{ tools | tojson }}{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}"
    "{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{{ '\\n' }}{% endif %}"
)

WORDS = (
    "the ledger records every call and the gateway passes bytes through unchanged while the server "
    "counts tokens for each request in a batch run of tickers with prompts and completions over time "
    "apple market price report quarter revenue growth forecast stock share trade volume model token "
    "stream chunk usage metric speed queue cache prefix decode draft accept reject batch night day hour"
).split()


def training_text(rng: random.Random) -> list[str]:
    lines = []
    for _ in range(4000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        lines.append(" ".join(words) + rng.choice([".", ",", "?", "!", ":"]))
    return lines


def build_tokenizer(rng: random.Random) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(rng), trainer=trainer)
    return tokenizer


def cycle_tokens(tokenizer: object, rng: random.Random) -> list[int]:
    """Ids of whole-word tokens (" word": a space, then lower-case letters), shuffled; the output reads as words."""
    vocab: dict[str, int] = tokenizer.get_vocab()  # type: ignore[attr-defined]
    ids = []
    for token_id in sorted(vocab.values()):
        text = tokenizer.decode([token_id])  # type: ignore[attr-defined]
        if token_id < len(SPECIAL_TOKENS) or not re.fullmatch(r" [a-z]+", text):
            continue
        ids.append(token_id)
    rng.shuffle(ids)
    return ids[: (len(ids) // CYCLE) * CYCLE]


def build_model(out: Path, tokenizer: object, cycles: list[int]) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    vocab: dict[str, int] = tokenizer.get_vocab()  # type: ignore[attr-defined]
    vocab_size = len(vocab)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=vocab[BOS],
        eos_token_id=vocab[EOS],
        pad_token_id=vocab[PAD],
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        # every other token (specials, bytes, word pieces) shares the embedding of one cycle token, so
        # it too has one clear successor: sampling at temperature 0.8 picks what greedy would
        cycle_set = set(cycles)
        for token_id in range(vocab_size):
            if token_id not in cycle_set:
                embeddings[token_id] = embeddings[cycles[token_id % len(cycles)]]
        head = torch.zeros_like(model.lm_head.weight)
        # successor(t) = the next token in t's cycle: head row of the successor = t's own embedding,
        # scaled so the greedy choice has a wide margin even in bfloat16.
        for start in range(0, len(cycles), CYCLE):
            ring = cycles[start : start + CYCLE]
            for i, token_id in enumerate(ring):
                head[ring[(i + 1) % CYCLE]] = embeddings[token_id] * 20.0
        model.lm_head.weight.copy_(head)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes its own generation_config.json; replace it with a fixed, minimal one
    GenerationConfig(bos_token_id=vocab[BOS], eos_token_id=vocab[EOS], pad_token_id=vocab[PAD]).save_pretrained(out)


def write_tokenizer(out: Path, tokenizer: object) -> None:
    tokenizer.save(str(out / "tokenizer.json"))  # type: ignore[attr-defined]
    added = {}
    vocab: dict[str, int] = tokenizer.get_vocab()  # type: ignore[attr-defined]
    for token in SPECIAL_TOKENS:
        added[str(vocab[token])] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    tokenizer = build_tokenizer(rng)
    cycles = cycle_tokens(tokenizer, rng)
    write_tokenizer(out, tokenizer)
    build_model(out, tokenizer, cycles)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build_model.py OUT_DIR", file=sys.stderr)
        return 2
    build(Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
