"""Tiny random-weight models for tests and benchmarks, built locally from config.

Three models, each in its own directory with the files vLLM loads (``config.json``,
``model.safetensors``, a tokenizer trained here with ``tokenizers``, the chat template and,
for the vision-language models, the image processor):

* ``vlm``: an Idefics3 model (a 1-layer SigLIP-style vision tower, a 2-layer Llama, head
  size 32) that reads each image (several per prompt) at 64x64 as 4 tokens. Its image
  processor is transformers' PIL one (no image splitting),
  so it needs no torchvision (see
  :func:`rayorch.pipelines.vllm_runtime.hide_unloadable_torch_extensions`).
* ``text``: a 2-layer Llama (head size 32) with the same tokenizer.
* ``mineru``: a Qwen2-VL (``Qwen2VLForConditionalGeneration``, MinerU2.5's architecture: a
  1-layer vision tower, a 2-layer Qwen2 with M-RoPE, head size 32) whose tokenizer holds
  Qwen2-VL's chat and vision tokens, MinerU's layout tokens (``<|box_start|>``,
  ``<|ref_start|>``, ``<|rotate_up|>``, ...) and OTSL's table tokens, trained on
  mineru-vl-utils' prompts. Its image processor is transformers' PIL one and reads an image
  at most 112x112 pixels (16 tokens: a 1036x1036 layout page too).

Nothing is downloaded; weights come from fixed seeds, so a build is the same bytes every
time. Each model's directory is named by a digest of everything that shapes it
(``vlm-<digest>``): a second build finds the finished directory and returns it.

    python -m rayorch.testmodels DIR   # prints {"vlm": "DIR/vlm-...", "text": ..., "mineru": ...}
    python -m rayorch.testmodels DIR --kind mineru

With random weights a greedy answer is the same text whatever the input: to see that an
input reached the engine, compare first-token log-probabilities, not texts; ``mineru``'s
answers never parse as a layout unless constrained (the tests' regexes,
:data:`rayorch.pipelines.document.mineru_blocks.TEST_REGEXES`). Needs ``pip install
'rayorch[model]'`` (torch, transformers, tokenizers, mineru-vl-utils).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

KIT_VERSION = 1
"""Bump when the build changes in a way the configs below do not show."""

SEED = 1234
MAX_POSITIONS = 1024
"""Both models' own context limit (``max_position_embeddings``)."""

IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR = 64, 16, 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
"""``<image>`` tokens one image becomes in the ``vlm`` model's prompt (pixel-shuffled)."""

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<fake_token_around_image>",
                  "<end_of_utterance>", "<global-img>",
                  *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
VOCAB_SIZE = 512

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {{ message['content'] }}\n"
    "{% elif message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% else %}ASSISTANT: {{ message['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
"""Plain-string message content: vLLM puts each image's ``<image>`` before the text."""

TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": MAX_POSITIONS, "vocab_size": VOCAB_SIZE,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "torch_dtype": "float32",
}
VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE,
    "num_channels": 3,
}
MODELS = ("vlm", "text", "mineru")

MINERU_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|box_start|>", "<|box_end|>",
    "<|ref_start|>", "<|ref_end|>", "<|quad_start|>", "<|quad_end|>", "<|rotate_up|>",
    "<|rotate_right|>", "<|rotate_down|>", "<|rotate_left|>",
    "<fcel>", "<ecel>", "<lcel>", "<ucel>", "<xcel>", "<nl>"]
"""Qwen2-VL's chat and vision tokens, MinerU2.5's layout tokens and OTSL's table tokens."""
MINERU_VOCAB_SIZE = 640
MINERU_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2-VL's template, shortened: each image part becomes its vision tokens in place."""
MINERU_TEXT_CONFIG: dict[str, Any] = {
    **{key: value for key, value in TEXT_CONFIG.items()
       if not key.endswith("_token_id") and key != "torch_dtype"},
    "vocab_size": MINERU_VOCAB_SIZE, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                        "mrope_section": [4, 6, 6]},
}
"""The text model's shape of :data:`TEXT_CONFIG` with MinerU's vocabulary, norm and M-RoPE."""
MINERU_VISION_CONFIG: dict[str, Any] = {
    "depth": 1, "embed_dim": 64, "hidden_size": 64, "mlp_ratio": 2, "num_heads": 2,
    "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
}
MINERU_MAX_PIXELS = 112 * 112
"""The most pixels the ``mineru`` model's image processor keeps of an image (16 tokens)."""


WORDS = ["the", "a", "page", "of", "document", "text", "table", "heading", "list",
         "formula", "scene", "video", "clip", "image", "shows", "person", "walks", "car",
         "road", "tree", "sky", "light", "dark", "moves", "camera", "frame", "one", "two",
         "three", "first", "second", "last", "read", "write", "number", "name", "title"]


def _word_salad() -> list[str]:
    """Deterministic word salad: every word next to every other."""
    return [" ".join(WORDS[(i * k + k * k) % len(WORDS)] for k in range(1, 12))
            for i in range(400)]


def _corpus() -> list[str]:
    """The tokenizer's training text: the shipped prompts plus plain English, fixed."""
    from rayorch.pipelines.document.ocr import DEFAULT_VLM_PROMPT
    from rayorch.pipelines.video_annotate import DEFAULT_CAPTION_PROMPT

    return [DEFAULT_VLM_PROMPT, DEFAULT_CAPTION_PROMPT, "USER: ASSISTANT:", *_word_salad()]


def _mineru_corpus() -> list[str]:
    """The ``mineru`` tokenizer's training text: mineru-vl-utils' prompts, layout lines on
    the 0-1000 grid with every block type, LaTeX and OTSL pieces, plain English."""
    from mineru_vl_utils.mineru_client import DEFAULT_PROMPTS
    from mineru_vl_utils.structs import BLOCK_TYPES

    lines = sorted(set(DEFAULT_PROMPTS.values()) - {""})
    kinds = sorted(BLOCK_TYPES)
    for i in range(200):  # every type, numbers of 1 to 3 digits
        x, y = (i * 37) % 1000, (i * 91) % 1000
        lines.append(f"<|box_start|>{x} {y} {(x + 123) % 1000} {(y + 45) % 1000}<|box_end|>"
                     f"<|ref_start|>{kinds[i % len(kinds)]}<|ref_end|><|rotate_up|>")
    lines += ["\\frac{a}{b} + x^{2} = \\sum_{i=1}^{n} y_i", "<fcel>1<fcel>2<nl><ecel><lcel>"]
    return lines + _word_salad()


def digest(kind: str) -> str:
    """A short digest of everything that shapes model ``kind`` (its directory's name)."""
    if kind not in MODELS:
        raise ValueError(f"unknown test model {kind!r}: choose one of {', '.join(MODELS)}")
    if kind == "mineru":
        shape = {"kit": KIT_VERSION, "kind": kind, "seed": SEED, "text": MINERU_TEXT_CONFIG,
                 "vision": MINERU_VISION_CONFIG, "pixels": MINERU_MAX_PIXELS,
                 "vocab": MINERU_VOCAB_SIZE, "special": MINERU_SPECIAL_TOKENS,
                 "template": MINERU_CHAT_TEMPLATE, "corpus": _mineru_corpus()}
    else:
        shape = {"kit": KIT_VERSION, "kind": kind, "seed": SEED, "text": TEXT_CONFIG,
                 "vision": VISION_CONFIG if kind == "vlm" else None, "vocab": VOCAB_SIZE,
                 "special": SPECIAL_TOKENS, "template": CHAT_TEMPLATE, "corpus": _corpus()}
    blob = json.dumps(shape, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _transformers() -> Any:
    """transformers, ready to build image processors on torch+cpu (its classes, untyped)."""
    from rayorch.pipelines.vllm_runtime import hide_unloadable_torch_extensions

    hide_unloadable_torch_extensions()
    import transformers

    return transformers


def _trained_bpe(corpus: list[str], special: list[str], vocab_size: int,
                 unk: str | None) -> Any:
    """A byte-level BPE tokenizer (``tokenizers``) trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE(unk_token=unk))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator(corpus, trainer=trainer)
    return raw


def _tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on :func:`_corpus`, as a transformers tokenizer."""
    tf = _transformers()
    raw = _trained_bpe(_corpus(), SPECIAL_TOKENS, VOCAB_SIZE, "<unk>")
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", chat_template=CHAT_TEMPLATE, model_max_length=MAX_POSITIONS)


def _mineru_tokenizer() -> Any:
    """Qwen2-VL's special tokens over a BPE trained on :func:`_mineru_corpus`."""
    tf = _transformers()
    raw = _trained_bpe(_mineru_corpus(), MINERU_SPECIAL_TOKENS, MINERU_VOCAB_SIZE, None)
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=MINERU_CHAT_TEMPLATE, model_max_length=MAX_POSITIONS)


def _save_text(out: Path, tokenizer: Any) -> None:
    tf = _transformers()
    tf.LlamaForCausalLM(tf.LlamaConfig(**TEXT_CONFIG)).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _save_vlm(out: Path, tokenizer: Any) -> None:
    tf = _transformers()
    config = tf.Idefics3Config(
        vision_config=tf.Idefics3VisionConfig(**VISION_CONFIG),
        text_config=tf.LlamaConfig(**TEXT_CONFIG), scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
        pad_token_id=TEXT_CONFIG["pad_token_id"])
    tf.Idefics3ForConditionalGeneration(config).save_pretrained(out)
    processor = tf.Idefics3Processor(
        image_processor=tf.Idefics3ImageProcessorPil(
            size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
            do_image_splitting=False),
        tokenizer=tokenizer, image_seq_len=IMAGE_TOKENS, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _save_mineru(out: Path) -> None:
    tf = _transformers()
    tokenizer = _mineru_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in MINERU_SPECIAL_TOKENS}
    text = {**MINERU_TEXT_CONFIG, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    config = tf.Qwen2VLConfig(
        text_config=text, vision_config=MINERU_VISION_CONFIG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    config.eos_token_id = ids["<|im_end|>"]
    tf.Qwen2VLForConditionalGeneration(config).save_pretrained(out)
    image_processor = tf.Qwen2VLImageProcessorPil(
        size={"shortest_edge": 28 * 28, "longest_edge": MINERU_MAX_PIXELS})
    image_processor.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build(kind: str, root: str | Path) -> Path:
    """Model ``kind`` (``"vlm"``, ``"text"`` or ``"mineru"``) under ``root``: built once,
    then found.

    The build goes to a temporary directory renamed into place, so a crash leaves no
    half-built model and concurrent builders end with one directory.
    """
    root = Path(root)
    target = root / f"{kind}-{digest(kind)}"
    if (target / "config.json").is_file():
        return target
    tf = _transformers()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
    work.chmod(0o755)
    try:
        tf.set_seed(SEED)
        if kind == "mineru":
            _save_mineru(work)
        else:
            (_save_vlm if kind == "vlm" else _save_text)(work, _tokenizer())
        image_tokens = {"vlm": IMAGE_TOKENS, "mineru": MINERU_MAX_PIXELS // (28 * 28)}
        (work / "rayorch-testmodel.json").write_text(json.dumps(
            {"kind": kind, "digest": digest(kind), "max_model_len": MAX_POSITIONS,
             "image_tokens": image_tokens.get(kind, 0)}, indent=1) + "\n")
        try:
            os.rename(work, target)
        except OSError:  # another builder finished first: keep its directory
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def build_all(root: str | Path) -> dict[str, Path]:
    """Every test model under ``root``: ``{"vlm": path, "text": path, "mineru": path}``."""
    return {kind: build(kind, root) for kind in MODELS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rayorch.testmodels",
        description="Build the tiny random-weight test models (nothing is downloaded).")
    parser.add_argument("dir", help="directory to build into (reused: each model is built once)")
    parser.add_argument("--kind", choices=MODELS, action="append",
                        help="build only this model (repeatable; default: all)")
    args = parser.parse_args(argv)
    built = {kind: str(build(kind, args.dir)) for kind in (args.kind or MODELS)}
    print(json.dumps(built))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
