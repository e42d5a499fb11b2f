"""The Cluster-Former QA task: binarised QA splits (fairseq-clusterformer-qa-binarize) plus the K-Means hook.

No ``from __future__ import annotations`` here: fairseq reads the config field types at run time.
"""

import copy
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from fairseq import utils
from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from fairseq.utils import safe_getattr
from omegaconf import II, OmegaConf, open_dict

from fairseq_clusterformer.compat.autocast_bf16 import AutocastBF16Config, AutocastBF16Hooks
from fairseq_clusterformer.compat.loss_scaler import LossScalerResumeHooks
from fairseq_clusterformer.qa.data.binarized import QABinarizedSplit, span_text
from fairseq_clusterformer.qa.data.dataset import CONTEXT_OVERFLOW, QADataset, QALimits
from fairseq_clusterformer.qa.data.encode import MAX_QUESTION_TOKENS
from fairseq_clusterformer.qa.data.tokenizers import PARAGRAPH_TOKEN
from fairseq_clusterformer.qa.ops.spans import AnswerPrediction, decode_answers
from fairseq_clusterformer.refresh.task_hooks import CentroidRefreshHooks, MemoryBankConfig

logger = logging.getLogger(__name__)


@dataclass
class ClusterFormerQAConfig(FairseqDataclass, MemoryBankConfig, AutocastBF16Config):
    data: str = field(default="", metadata={"help": "directory written by fairseq-clusterformer-qa-binarize"})
    max_question_tokens: int = field(
        default=MAX_QUESTION_TOKENS,
        metadata={"help": "questions with more tokens are skipped (a window is <s> question </s></s> context)"},
    )
    max_context_train: int = field(
        default=5000, metadata={"help": "longest context (tokens) in the training split; see --context-overflow"}
    )
    max_context_eval: int = field(
        default=10000, metadata={"help": "longest context (tokens) in validation / prediction splits"}
    )
    context_overflow: ChoiceEnum(CONTEXT_OVERFLOW) = field(
        default="truncate",
        metadata={
            "help": "a longer context: truncate it (training split: whole paragraphs, those with a gold answer "
            "first; other splits: its first tokens) or skip the example; both are counted in the log"
        },
    )
    max_answer_tokens: int = field(default=30, metadata={"help": "longest answer span the decoder considers"})
    train_subset: str = II("dataset.train_subset")
    seed: int = II("common.seed")


@register_task("clusterformer_qa", dataclass=ClusterFormerQAConfig)
class ClusterFormerQATask(LossScalerResumeHooks, CentroidRefreshHooks, AutocastBF16Hooks, FairseqTask):
    """Extractive QA over long contexts; Natural Questions-style data (answer types) adds the NQ heads."""

    def __init__(self, cfg: ClusterFormerQAConfig, dictionary: Dictionary, answer_types: bool):
        super().__init__(cfg)
        self.dictionary = dictionary
        if PARAGRAPH_TOKEN not in dictionary.indices:
            raise ValueError(f"{cfg.data}/dict.txt has no paragraph symbol {PARAGRAPH_TOKEN}: binarise the data again")
        self.paragraph = dictionary.index(PARAGRAPH_TOKEN)
        self.answer_types = answer_types
        self.splits = {}
        self.init_centroid_refresh(cfg)

    @classmethod
    def setup_task(cls, cfg: ClusterFormerQAConfig, **kwargs):
        data_dir = utils.split_paths(cfg.data)[0] if cfg.data else ""
        if not os.path.isfile(os.path.join(data_dir, "dict.txt")):
            raise FileNotFoundError(f"task data {data_dir!r}: no dict.txt; give a directory written by the binariser")
        dictionary = Dictionary.load(os.path.join(data_dir, "dict.txt"))
        return cls(cfg, dictionary, answer_types=has_answer_types(data_dir))

    @property
    def max_question_tokens(self) -> int:
        return self.cfg.max_question_tokens

    def split_data(self, split: str) -> QABinarizedSplit:
        if split not in self.splits:
            self.splits[split] = QABinarizedSplit(utils.split_paths(self.cfg.data)[0], split)
        return self.splits[split]

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        training = split == self.cfg.train_subset
        limits = QALimits(
            max_question_tokens=self.cfg.max_question_tokens,
            max_context_tokens=self.cfg.max_context_train if training else self.cfg.max_context_eval,
            context_overflow=str(self.cfg.context_overflow),
            training=training,
        )
        dataset = QADataset(self.split_data(split), limits, self.dictionary.pad(), shuffle=training, seed=self.cfg.seed)
        logger.info(dataset.report())
        if len(dataset) == 0:
            raise ValueError(f"no usable example in split {split!r}: {dataset.report()}")
        self.datasets[split] = dataset
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq's checkpoint loaders (fairseq-validate, the prediction script, hub loading) pass
        ``from_checkpoint``: the checkpoint holds every weight, so the pretrained RoBERTa named in its saved config
        is not read (it may have moved since training)."""
        if from_checkpoint and safe_getattr(cfg, "roberta_path", None):
            cfg = copy.deepcopy(cfg)
            if OmegaConf.is_config(cfg):
                with open_dict(cfg):
                    cfg.roberta_path = None
            else:
                cfg.roberta_path = None
        return super().build_model(cfg, from_checkpoint)

    def decode_answers(self, logits, context) -> list[AnswerPrediction]:
        """The answers of a batch (the model's logits, its B x T context) under this task's dictionary and
        --max-answer-tokens: what validation scores and fairseq-clusterformer-qa-predict writes."""
        return decode_answers(logits, context, self.dictionary.pad(), self.paragraph, self.cfg.max_answer_tokens)

    def answer_text(self, split: str, example_index: int, start: int, end: int) -> str:
        """Text of the inclusive token span [start, end] of one example's context as the model read it (a training
        split's cut may have moved its paragraphs)."""
        data = self.split_data(split)
        dataset = self.datasets.get(split)
        if data.texts is not None:
            # a tokeniser that is not lossless (--tokenizer hf): the characters of the original context
            offsets = dataset.model_offsets(example_index) if dataset is not None else None
            return data.span_text(example_index, start, end, offsets)
        context = dataset.model_context(example_index) if dataset is not None else data.contexts[example_index]
        return span_text(data.tokenizer, context, start, end)

    def max_positions(self):
        return None  # the dataset enforces the context limits itself, with counts

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


def has_answer_types(data_dir: str, splits: Optional[list] = None) -> bool:
    """Whether the data carries Natural Questions answer types (then the model gets the NQ heads)."""
    for split in splits or ("train", "valid", "test"):
        path = os.path.join(data_dir, f"{split}.meta.jsonl")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                first = f.readline()
            return bool(first.strip()) and json.loads(first).get("answer_type") is not None
    return False
