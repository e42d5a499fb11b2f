"""The exported folder's model card (``README.md``): what the model is, how it was trained, its held-out score as
the checkpoint records it, and how to load it."""

from __future__ import annotations

import json
from pathlib import Path

from fairseq_clusterformer.qa.hf_model.configuration import ClusterFormerQAHFConfig


def training_record(state: dict) -> dict:
    """What a fairseq checkpoint says of its run: updates, the best-checkpoint metric at this save and the run's
    best (``extra_state``), and the training settings that shape the model."""
    cfg = state["cfg"]
    history = (state.get("optimizer_history") or [{}])[-1]
    extra = state.get("extra_state") or {}
    metric = getattr(cfg.checkpoint, "best_checkpoint_metric", None) if cfg.get("checkpoint") else None
    return {
        "arch": getattr(cfg.model, "_name", None),
        "updates": history.get("num_updates"),
        "max_update": getattr(cfg.optimization, "max_update", None) if cfg.get("optimization") else None,
        "lr": list(getattr(cfg.optimization, "lr", [])) if cfg.get("optimization") else None,
        "metric": metric,
        "metric_at_save": _number(extra.get("val_loss")),
        "metric_best": _number(extra.get("best")),
    }


def recipe_scores(checkpoint: str) -> dict | None:
    """EM / F1 of this checkpoint on its held-out questions, where examples/qa/cpu_pretrained.sh scored it: the run
    folder's summary.json (``{run: {"exact_match", "f1", "questions", ...}}``), written after its last update."""
    summary = Path(checkpoint).parent / "summary.json"
    try:
        row = json.loads(summary.read_text(encoding="utf-8"))[Path(checkpoint).parent.name]
        return {"exact_match": round(float(row["exact_match"]), 2), "f1": round(float(row["f1"]), 2),
                "questions": int(row["questions"]), "file": str(summary)}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _number(value) -> float | None:
    try:
        return None if value is None else round(float(value), 4)
    except (TypeError, ValueError):
        return None


def layer_plan(config: ClusterFormerQAHFConfig) -> str:
    if config.long_range_layer == "none" or not config.long_range_layers:
        return f"all {config.num_hidden_layers} layers on sliding windows"
    return (
        f"{config.num_hidden_layers} layers: {config.long_range_layer} ({config.long_range_mode}) at layer(s) "
        f"{config.long_range_layers}, {config.num_clusters} clusters / buckets, sliding windows elsewhere"
    )


def model_card(config: ClusterFormerQAHFConfig) -> str:
    record = config.exported_from or {}
    metric = record.get("metric") or "the best-checkpoint metric"
    if record.get("metric_at_save") is not None:
        score = (
            f"Held-out {metric} at this checkpoint's save: **{record['metric_at_save']}** (the run's best: "
            f"{record.get('metric_best')}), as fairseq-train recorded it on the validation split. The checkpoint "
            "records one metric; for EM and F1 both, run `fairseq-clusterformer-qa-predict` on a split."
        )
    else:
        score = "The checkpoint records no validation score (saved without validation)."
    lr = ", ".join(map(str, record.get("lr") or [])) or "unknown"
    scored = record.get("recipe_scores")
    if scored:
        score += (
            f" Scored by its recipe on {scored['questions']} held-out questions: **EM {scored['exact_match']}, F1 "
            f"{scored['f1']}** (`{scored['file']}`)."
        )
    return f"""---
library_name: transformers
pipeline_tag: question-answering
tags: [cluster-former, long-context, extractive-qa, fairseq_clusterformer]
---

# Cluster-Former extractive QA ({record.get('arch')})

A question-answering model trained with the fairseq_clusterformer package (Cluster-Former, Wang et al., Findings
of ACL 2021): a BERT/RoBERTa-style encoder whose layers run on windows of {config.window_size} context
tokens (stride {config.window_stride}) that each carry the question, {layer_plan(config)}. It reads a whole document
of up to {config.max_context_tokens} tokens in one pass and gives start / end logits over it.

## Training

`fairseq-train --arch {record.get('arch')}`, {record.get('updates')} updates (of --max-update
{record.get('max_update')}), learning rate {lr}; exported from `{record.get('checkpoint')}` (sha256
`{record.get('sha256')}`) by `fairseq-clusterformer-export-hf`.

{score}

## Use

Needs the `fairseq_clusterformer` package installed (its layers compute the forward pass) and `trust_remote_code`:

```python
from transformers import pipeline

qa = pipeline("question-answering", model="PATH", trust_remote_code=True, local_files_only=True)
qa(question="...", context=open("document.txt").read())  # {{'answer', 'start', 'end', 'score'}}
```

The pipeline reads the whole document at once (no 384-token chunks) and answers as `fairseq-clusterformer-qa-ask`
does. `AutoModelForQuestionAnswering.from_pretrained("PATH", trust_remote_code=True)` takes the tokenizer's pair
encoding `tokenizer(question, context)`. Inference only: the centroids are refreshed by K-Means in fairseq-train.
"""
