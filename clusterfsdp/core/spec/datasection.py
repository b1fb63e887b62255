"""The sections that say what a job reads: `[model]`, `[data]` (with its `[[data.sources]]`) and
`[eval]`."""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`schema.hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

from typing import Any, Literal

from ..value import value
from .docfield import F

# Upper bound of the tokenizing processes of one host: more is a typo, and would exhaust the node
# (or the login node) before anything useful happens.
MAX_PREPARE_WORKERS = 512  # data.prepare_workers


@value
class ModelSection:
    """[model]: which model (a folder, a hub id, a config or a preset) and its dtype."""

    name_or_path: str = F(
        "",
        "Pretrained weights: a local HF model folder (config.json + *.safetensors) or a hub id (org/name), "
        "resolved on the submitting host to a snapshot in the HF cache (HF_HOME), downloaded there if missing; "
        "compute nodes never download. Any AutoModelForCausalLM family. Empty: random init (`config`, `preset`).",
    )
    revision: str = F(
        "",
        "Hub revision (branch, tag or commit) of a hub id in name_or_path or config (empty: the default branch); "
        "the run's job.toml records the commit it resolved to.",
    )
    config: str = F(
        "",
        "Random init from a config: a folder with a config.json (or a hub id), any AutoModelForCausalLM family.",
    )
    preset: str = F(
        "llama-tiny",
        "Built-in config for random init (when name_or_path and config are empty): llama-tiny, llama-small, "
        "llama-1b, qwen2-tiny, gpt-neox-tiny, "
        'mixtral-tiny; "" to build from from_config alone (it must then name a model_type).',
    )
    from_config: dict[str, Any] = F(
        {},
        "Config keys over the preset's, the config folder's or the pretrained model's, e.g. "
        '{ num_hidden_layers = 4 } or { output_router_logits = true }; with preset = "", a model_type and its '
        'keys, e.g. { model_type = "qwen2", hidden_size = 256, ... } (transformers\' defaults fill the rest). '
        "With pretrained weights, keys that change shapes fail when the weights load.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = F(
        "float32",
        "dtype of the master weights: every weight of a full fine-tune; with [peft], the adapters and "
        "modules_to_save (with their gradients and AdamW moments) and the frozen base unless peft.base_dtype says "
        "otherwise.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = F("sdpa", "HF attention kernel.")


@value
class DataSource:
    """One `[[data.sources]]` entry: a dataset of a mixture, with its weight and field mapping."""

    path: str = F(
        "",
        "A file, folder or glob like an entry of data.paths (relative to this file), read as its own prepared dataset.",
    )
    weight: float = F(
        1.0,
        "Its share of the training samples (weights are normalized over the sources; a sample is seq_len "
        "positions of one source, so this is also its share of the tokens trained on).",
    )
    format: Literal["", "text", "chat", "preference", "unpaired"] = F(
        "",
        "'text', 'chat', 'preference' or 'unpaired' (empty: data.format; preference and unpaired sources cannot "
        "mix with others).",
    )
    split: str = F("", "Split of a dataset folder (empty: data.split).")
    text_key: str = F("", "Field holding the text (format = 'text'; empty: data.text_key).")
    messages_key: str = F(
        "", "Field holding the conversation (format = 'chat'; empty: data.messages_key), e.g. 'conversations'."
    )
    prompt_key: str = F("", "format = 'preference': the field holding the prompt (empty: data.prompt_key).")
    chosen_key: str = F("", "format = 'preference': the field holding the preferred answer (empty: data.chosen_key).")
    rejected_key: str = F(
        "", "format = 'preference': the field holding the dispreferred answer (empty: data.rejected_key)."
    )
    completion_key: str = F("", "format = 'unpaired': the field holding the completion (empty: data.completion_key).")
    label_key: str = F(
        "", "format = 'unpaired': the field holding the true/false desirability label (empty: data.label_key)."
    )
    role_key: str = F("role", "Field of each message holding its role, e.g. 'from' (ShareGPT).")
    content_key: str = F("content", "Field of each message holding its text, e.g. 'value' (ShareGPT).")
    roles: dict[str, str] = F(
        {},
        "Role values of the source and the chat role each becomes, e.g. { human = 'user', gpt = 'assistant' }; "
        "values not named are kept.",
    )
    prompt: str = F(
        "",
        "Instead of a field: a template of the record's columns, {name} each (e.g. '{instruction}\\n\\n{input}', "
        "Alpaca), rendered and stripped: the user message (format 'chat') or the start of the text ('text').",
    )
    response: str = F(
        "", "With prompt: the template of the answer (e.g. '{output}'): the assistant message, or the rest of the text."
    )
    system: str = F("", "With prompt, format 'chat': the template of a system message (none when it renders empty).")


@value
class DataSection:
    """[data]: the training data, its format, tokenizer, packing and prepared cache."""

    source: Literal["synthetic", "files"] = F("synthetic", "'synthetic' random tokens, or 'files' to read `paths`.")
    paths: list[str] = F(
        [],
        "Training data, with source = 'files': .txt files (one document each), .jsonl records (also .jsonl.gz, "
        ".jsonl.zst), .parquet files, folders written by datasets' save_to_disk, or folders that "
        "datasets.load_dataset reads (parquet/json/csv files); globs allowed; relative to this file. "
        "Tokenized once into a prepared dataset (see cache_dir) that every rank reads without loading it.",
    )
    format: Literal["text", "chat", "preference", "unpaired"] = F(
        "text",
        "'text': each record is a document (`text_key`); 'chat': each record holds a conversation "
        "(`messages_key`: a list of {role, content}) rendered with the tokenizer's chat template, and the "
        "loss is computed on the assistant messages only; 'preference': each record is a pair for preference "
        "training (train.objective): a prompt (`prompt_key`) and a preferred and a dispreferred answer "
        "(`chosen_key`, `rejected_key`), each a string (joined as text) or a list of {role, content} messages "
        "(rendered with the chat template); the loss is on the answers' tokens only; 'unpaired': each record "
        "is one example for train.objective = 'kto': a prompt (`prompt_key`), a completion (`completion_key`, a "
        "string or messages like a pair's answer) and a `label_key` true (desirable) or false (undesirable).",
    )
    text_key: str = F("text", "Field holding the text of .jsonl, parquet and dataset records (format = 'text').")
    messages_key: str = F("messages", "Field holding the list of {role, content} messages (format = 'chat').")
    prompt_key: str = F(
        "prompt",
        "format = 'preference': the field holding the prompt (a string or messages); '' when the answers hold "
        "the whole conversation (the messages they begin with alike are the prompt: Anthropic-HH style).",
    )
    chosen_key: str = F("chosen", "format = 'preference': the field holding the preferred answer.")
    rejected_key: str = F("rejected", "format = 'preference': the field holding the dispreferred answer.")
    completion_key: str = F("completion", "format = 'unpaired': the field holding the completion.")
    label_key: str = F(
        "label", "format = 'unpaired': the field holding the label, true (desirable) or false (undesirable)."
    )
    split: str = F("train", "Split to read from a dataset folder that holds several (save_to_disk or load_dataset).")
    sources: list[DataSource] = F(
        [],
        "Instead of paths: several datasets mixed by weight, each a [[data.sources]] table (path, weight, format, "
        "split and a field mapping; docs/data.md). Samples are drawn from them in a seeded, resumable order; an "
        "epoch is as many samples as the sources hold together.",
    )
    tokenizer: str = F(
        "auto",
        "'auto': the tokenizer of model.name_or_path when that folder (or hub snapshot) has one "
        "(tokenizer.json, tokenizer_config.json, ...), else 'bytes'; the run's job.toml records the choice. "
        "'bytes': the built-in byte-level tokenizer (no download). Or a local HF tokenizer folder (write a "
        "folder named auto or bytes as ./auto) or a hub id (resolved on the submitting host like "
        "model.name_or_path, at model.revision when it is the model's id); with a chat template for "
        "format = 'chat'.",
    )
    seq_len: int = F(128, "Tokens per sample.")
    packing: Literal["auto", "concat", "documents"] = F(
        "auto",
        "How documents become samples. 'concat': one token stream (EOS after each text document) cut into "
        "seq_len windows that cross document boundaries. 'documents': whole documents packed into samples, the "
        "rest padded (never trained on); position ids restart at each document and attention stays inside it "
        "(sdpa and eager: a block-diagonal mask; flash_attention_2: its variable-length kernel); a document "
        "longer than seq_len is cut into seq_len-token pieces, each its own context. 'auto': 'documents' for "
        "format = 'chat', else 'concat'.",
    )
    overlong: Literal["split", "truncate", "drop"] = F(
        "split",
        "A document longer than seq_len, packing = 'documents' (not 'concat'): 'split' into seq_len pieces, each "
        "its own context; 'truncate' to its start (a conversation: the whole leading turns that fit, never an "
        "answer without its prompt; none fits: dropped); 'drop'. Applied to the sample index, not the tokens. "
        "Preference pairs keep a long answer's start ('split', 'truncate') or drop the pair ('drop'; also when "
        "an answer would keep no token).",
    )
    cache_dir: str = F(
        "",
        "Folder of prepared (tokenized) datasets, shared by all ranks and jobs and keyed by the content of the "
        "sources, the tokenizer and the format (empty: <run_root>/.cache/tokens). On a cluster: the shared "
        "filesystem.",
    )
    bad_records: str = F(
        "error",
        "A record prepare cannot read (bad JSON, a missing or mistyped key, not UTF-8, a conversation the chat "
        "template refuses): 'error' stops at the first (file:line named); 'skip' leaves them out, counted in the "
        "prepared dataset's manifest (shown by `data prepare`, `validate`); 'skip:N' / 'skip:P%' fail beyond N "
        "records / P percent of them. Skipping is a prepared dataset of its own. .txt files always fail.",
    )
    prepare_workers: int = F(
        0,
        "Processes that tokenize when a dataset is prepared (0: every CPU this process may use; at most "
        f"{MAX_PREPARE_WORKERS}).",
    )
    prepare: Literal["job", "in_job", "require"] = F(
        "job",
        "Where data that is not prepared yet gets tokenized, when the job is submitted to Slurm: 'job' a Slurm "
        "job array of its own (one task per node of the job, on prepare_partition), queued first, the training "
        "job waiting for it (--dependency=afterok); 'in_job' rank 0 of the training job, while the other GPUs "
        "wait; 'require' refuse to submit (prepare it with `clusterfsdp data prepare`). The local executor "
        "always prepares in the job.",
    )
    prepare_partition: str = F(
        "", "Slurm partition of the prepare job array (data.prepare = 'job'; empty: the job's slurm.partition)."
    )


@value
class EvalSection:
    """[eval]: the held-out set and how often it is evaluated."""

    fraction: float = F(
        0.0,
        "Fraction of the training documents held out for evaluation (chosen by job.seed, never trained on); 0: none.",
    )
    paths: list[str] = F(
        [], "Evaluation data instead of a held-out fraction: files or folders like data.paths (same format)."
    )
    split: str = F("", "Split of the dataset folders in eval.paths (e.g. 'test' of a DatasetDict); empty: data.split.")
    every_steps: int = F(0, "Evaluate every N steps (0: only after the last step); with fraction or paths.")
    batches: int = F(
        10,
        "Micro-batches each rank evaluates (train.micro_batch_size samples each): the first batches x ranks x "
        "micro_batch_size samples of a fixed order, the same every time. eval_loss and eval_ppl go into "
        "metrics.jsonl.",
    )
    samples: int = F(
        0,
        "Prompts generated greedily at every evaluation (0: off), written to <run>/samples/step-N.jsonl, the "
        "trackers and the TUI's run screen: the first lines of eval.samples_file, else the first samples of the "
        "eval set (a conversation up to its first answer, a text's first tokens). All ranks run the sharded "
        "model (one layer gathered at a time), so any model size that trains can generate.",
    )
    samples_file: str = F(
        "",
        'Prompts for eval.samples instead of the eval set: .txt (one prompt a line) or .jsonl ({"prompt": ...} '
        "a line); with data.format = 'chat' each is a user message rendered with the chat template.",
    )
    samples_max_new_tokens: int = F(64, "Tokens generated at most per prompt (generation stops at a special token).")
