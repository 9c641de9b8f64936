"""Build a tiny random-weight Qwen3 model directory that real `vllm serve` can load.

Usage: python make_tiny_model.py OUT_DIR [--vocab 4096] [--seed 0]

Nothing is downloaded: the tokenizer is a byte-level BPE trained on this Python's
own standard-library sources, the weights are random. The chat template is
Qwen3-style and opens the assistant turn with "<think>\n" (thinking on), or
"<think>\n\n</think>\n\n" when chat_template_kwargs {"enable_thinking": false}.

The lm_head rows of the special and tag tokens are zero, so under greedy decoding
the model never emits </think> or an end-of-turn token: a request with max_tokens
N always produces N tokens, all inside the reasoning block (content null,
finish_reason "length" with the qwen3 reasoning parser).

Needs: torch, transformers (>= 5), tokenizers, safetensors.
"""

import argparse
import json
import pathlib
import sysconfig

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special: stripped on decode
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # kept in decoded text, as in Qwen3

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def training_text(limit_files: int = 300):
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:limit_files]
    for p in files:
        yield p.read_text(encoding="utf-8", errors="replace")


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = pathlib.Path(args.out)

    tokenizer = build_tokenizer(args.vocab)
    vocab = tokenizer.get_vocab()
    eos = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]

    torch.manual_seed(args.seed)
    config = Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention supports head sizes >= 32
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=eos,
        pad_token_id=vocab["<|endoftext|>"],
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for t in SPECIAL + TAGS:
            model.lm_head.weight[vocab[t]] = 0  # never the argmax: see module docstring
    model.config.dtype = "bfloat16"
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = vocab["<|endoftext|>"]
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # Keep the template in tokenizer_config.json (as Qwen3 ships it) and name a class
    # that transformers 4.x and 5.x both know.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("backend", None)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)

    # Check: the probe prompt's greedy continuation has no special or tag token.
    msgs = [{"role": "user", "content": "Say hello in one sentence."}]
    ids = tokenizer.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    gen = model.generate(**ids, max_new_tokens=50, do_sample=False)[0, ids["input_ids"].shape[1] :]
    bad = {vocab[t] for t in SPECIAL + TAGS} & set(gen.tolist())
    assert not bad and len(gen) == 50, (bad, len(gen))
    print(
        json.dumps(
            {
                "dir": str(out),
                "vocab": len(vocab),
                "params": sum(p.numel() for p in model.parameters()),
                "prompt": tokenizer.decode(ids["input_ids"][0]),
                "greedy_50": tokenizer.decode(gen),
            }
        )
    )


if __name__ == "__main__":
    main()
