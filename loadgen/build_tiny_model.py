# mypy: ignore-errors
"""Build the tiny, randomly initialised Llama model that vLLM on CPU serves (`loadgen.vllm_server`: the
real-engine test tier and the benchmarks against a real engine).

Run it with the engine venv's python (it needs torch, transformers and tokenizers, which the project
venv does not have):

    $ENGINE_VENV/bin/python loadgen/build_tiny_model.py OUT_DIR

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on printable ASCII text generated
from a fixed seed, so every token decodes to whole ASCII characters: a random model can then emit any
token id without ever producing a partial UTF-8 sequence (which would make vLLM's incremental
detokenizer hold text back and streams stall). The model's vocabulary is exactly the tokenizer's.

The build writes into a sibling temporary directory and renames it into place, so OUT_DIR either does
not exist or holds a complete model; `loadgen.vllm_server` caches OUT_DIR by this file's hash.
"""

from __future__ import annotations

import argparse
import random
import shutil
import string
import sys
import tempfile
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
# Single-byte characters only: printable ASCII plus the whitespace a chat template and code need.
ALPHABET = "".join(chr(c) for c in range(0x20, 0x7F)) + "\t\n"

# Roles are written as plain text; every character in it is in ALPHABET, so it tokenizes cleanly.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# CPU attention in vLLM supports head sizes >= 32: hidden 128 over 4 heads gives 32.
HIDDEN_SIZE = 128
NUM_HEADS = 4
NUM_KV_HEADS = 2
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
# At least loadgen.vllm_server.MAX_MODEL_LEN.
MAX_POSITIONS = 8192


def training_corpus(rng: random.Random) -> list[str]:
    """Printable-ASCII lines that look a little like prose, code and chat, from a fixed seed."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels] + [v + c for v in vowels for c in "nrst"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    words += ["def", "return", "import", "class", "self", "None", "True", "False", "for", "in", "if"]
    words += ["user", "assistant", "system", "<|user|>", "<|assistant|>", "<|system|>"]
    lines = [ALPHABET, string.ascii_letters + string.digits + string.punctuation]
    for _ in range(4000):
        n = rng.randint(3, 14)
        line = " ".join(rng.choice(words) for _ in range(n))
        shape = rng.random()
        if shape < 0.15:
            line = f"{rng.choice(words)}({rng.choice(words)}, {rng.randint(0, 999)}) -> {line}"
        elif shape < 0.3:
            line = "\t" + line.replace(" ", "_", 2) + ":"
        elif shape < 0.45:
            line = line.capitalize() + rng.choice(".!?;")
        lines.append(line)
    return lines


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(SEED)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # No initial_alphabet: the trainer's alphabet is only the (byte-level mapped) characters that
    # occur in the corpus, i.e. ALPHABET, instead of all 256 bytes.
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS, PAD],
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(rng), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def check_tokenizer(tokenizer) -> None:
    """Every non-special token must decode to characters of ALPHABET; fail the build otherwise."""
    special = set(tokenizer.all_special_ids)
    allowed = set(ALPHABET)
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if not text or not set(text) <= allowed:
            raise SystemExit(f"token {token_id} decodes to {text!r}, outside printable ASCII")
    sample = "Hello, world! def f(x): return x + 1"
    if tokenizer.decode(tokenizer.encode(sample), skip_special_tokens=True) != sample:
        raise SystemExit("tokenizer does not round-trip printable ASCII")


def build_model(tokenizer):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

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
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to create (replaced if it exists)")
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir.absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    check_tokenizer(tokenizer)
    model = build_model(tokenizer)

    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        staging.chmod(0o755)
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"built {out_dir} (vocab {len(tokenizer)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
