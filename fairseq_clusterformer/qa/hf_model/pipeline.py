"""The question-answering pipeline of an exported model: a whole document read in one piece, answered as ``qa-ask``
answers it.

N = context tokens.

transformers 5 dropped its own ``question-answering`` pipeline; the exported ``config.json`` names this one under
``custom_pipelines``, so ``pipeline("question-answering", model=folder, trust_remote_code=True)`` builds it. It
tokenises as ``qa-ask`` does, with the same functions (``qa/data/user_text.py``: paragraphs at blank lines, a ``<p>``
before each, every token's characters in the text), runs the exported model on ``<s> question </s></s> context
</s>`` and decodes its logits with the task's decoder (``qa/ops/spans.py``: at most ``max_answer_tokens`` tokens,
inside one paragraph), so its answer is ``qa-ask``'s: the same text, character span and score (start logit + end
logit). A context over the model's ``max_context_tokens`` is refused, as ``qa-ask`` refuses it by default.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import Pipeline

from fairseq_clusterformer.qa.data.answer_spans import ParagraphTokenizer
from fairseq_clusterformer.qa.data.user_text import encode_context, encode_question, span_chars
from fairseq_clusterformer.qa.ops.spans import decode_answers, paragraph_ids, span_positions, top_spans

# the arguments of transformers 4's question-answering pipeline that cut a long document into chunks
CHUNKING = {"max_seq_len", "doc_stride", "max_question_len", "padding", "align_to_words", "handle_impossible_answer"}


class OffsetTokenizer:
    """The exported tokenizer as ``user_text`` reads a tokeniser: ids and every token's [start, end) characters,
    without special tokens (``lossless = False``: spans go through the offsets, as ``qa-ask``'s HF tokeniser)."""

    lossless = False

    def __init__(self, tokenizer) -> None:
        self.backend = tokenizer.backend_tokenizer  # the tokenizers library's Tokenizer that qa-ask's tokeniser is

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        encoding = self.backend.encode(text, add_special_tokens=False)
        return np.array(encoding.ids, dtype=np.int64), np.array(encoding.offsets, dtype=np.int64).reshape(-1, 2)


class ClusterFormerQAPipeline(Pipeline):
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs=None, question=None, context=None, **kwargs):
        """``pipe(question=..., context=...)``, ``pipe({"question", "context"})`` or a list of such dicts (a list of
        answers back). Returns {"answer", "start", "end", "score"} (a list of ``top_k`` of them when ``top_k`` > 1,
        sharing no token with a better one, as qa-ask's; ``overlapping=True``: the ``top_k`` best spans as they are)."""
        if inputs is None:
            inputs = {"question": question, "context": context}
        elif question is not None or context is not None:
            raise TypeError("give question= and context=, or a {'question', 'context'} dict (or a list of them)")
        return super().__call__(inputs, **kwargs)

    def _sanitize_parameters(self, top_k=None, max_answer_len=None, overlapping=None, **others):
        # the rest are transformers' loading arguments (local_files_only, ...), which pipeline() passes on
        chunking = sorted(set(others) & CHUNKING)
        if chunking:
            raise TypeError(
                f"{', '.join(chunking)}: this pipeline reads the whole document in one piece (up to the model's "
                f"{self.model.config.max_context_tokens} context tokens), it never cuts it into chunks"
            )
        post = {}
        if top_k is not None:
            post["top_k"] = int(top_k)
        if max_answer_len is not None:
            post["max_answer_len"] = int(max_answer_len)
        if overlapping is not None:
            post["overlapping"] = bool(overlapping)
        return {}, {}, post

    def preprocess(self, item) -> dict:
        if not isinstance(item, dict) or not {"question", "context"} <= item.keys():
            raise ValueError(f"expected question and context (a {{'question', 'context'}} dict), got {item!r}")
        config = self.model.config
        tokens = OffsetTokenizer(self.tokenizer)
        question = encode_question(tokens, item["question"], config.max_question_tokens)  # Q
        user = encode_context(ParagraphTokenizer(tokens), config.paragraph_token_id, item["context"])  # N, N x 2
        if len(user.ids) > config.max_context_tokens:
            raise ValueError(
                f"the context has {len(user.ids)} tokens, over the model's max_context_tokens "
                f"{config.max_context_tokens} (the --max-context-eval it was trained with): give a shorter context"
            )
        ids = [config.bos_token_id, *question, config.eos_token_id, config.eos_token_id, *user.ids, config.eos_token_id]
        return {
            "input_ids": torch.tensor([ids]),  # 1 x (Q + N + 4)
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "first": len(question) + 3,
            "context_ids": user.ids,
            "chars": user.chars,
            "text": item["context"],
        }

    def _forward(self, inputs: dict) -> dict:
        out = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        first, count = inputs["first"], len(inputs["context_ids"])
        return {
            "start": out.start_logits[:, first : first + count],  # 1 x N
            "end": out.end_logits[:, first : first + count],  # 1 x N
            **{key: inputs[key] for key in ("context_ids", "chars", "text")},
        }

    def postprocess(self, outputs: dict, top_k: int = 1, max_answer_len: int | None = None, overlapping: bool = False):
        config = self.model.config
        longest = max_answer_len or config.max_answer_tokens
        context = torch.from_numpy(outputs["context_ids"])[None]  # 1 x N
        pad, paragraph = config.pad_token_id, config.paragraph_token_id
        logits = {"start": outputs["start"].float(), "end": outputs["end"].float()}
        if top_k == 1:  # the decoder qa-ask's single answer comes from
            best = decode_answers(logits, context, pad, paragraph, longest)[0]
            spans = [(best.start, best.end, best.span_score)]
        else:
            valid = span_positions(context, pad, paragraph)  # 1 x N
            segments = paragraph_ids(context, paragraph)  # 1 x N
            ranked = top_spans(logits["start"], logits["end"], valid, longest, top_k, segments, overlapping)
            spans = list(zip(*(x[0].tolist() for x in ranked)))
        answers = []
        for start, end, score in spans:
            if score == float("-inf"):
                continue
            first, stop = span_chars(outputs["text"], outputs["chars"], start, end)
            answers.append({"answer": outputs["text"][first:stop], "start": first, "end": stop, "score": float(score)})
        return answers[0] if top_k == 1 and answers else answers
