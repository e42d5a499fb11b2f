"""The Cluster-Former language-modeling task: fairseq's language_modeling plus the memory-bank K-Means hook."""

import os
from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fairseq_clusterformer.tasks.centroid_hooks import CentroidRefreshHooks, MemoryBankConfig
from fairseq_clusterformer.tasks.checkpoint_files import (
    check_checkpoint_file,
    check_dictionary,
    checkpoint_files_to_load,
    dictionary_fingerprint,
)

DICTIONARY_KEY = "dictionary"


@dataclass
class ClusterFormerLMTaskConfig(LanguageModelingConfig, MemoryBankConfig):
    pass


@register_task("clusterformer_lm", dataclass=ClusterFormerLMTaskConfig)
class ClusterFormerLMTask(CentroidRefreshHooks, LanguageModelingTask):
    """Language modeling whose training fills the memory banks and refreshes the centroids with K-Means."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.init_centroid_refresh(args)

    @classmethod
    def setup_task(cls, args, **kwargs):
        # a task rebuilt from a checkpoint's stored config (from_checkpoint) must not inspect that run's files
        if not kwargs.get("from_checkpoint", False):
            for flag, path in checkpoint_files_to_load(args):
                check_checkpoint_file(path, flag)
        return super().setup_task(args, **kwargs)

    def dictionary_file(self) -> str:
        return os.path.join(str(self.args.data).split(os.pathsep)[0], "dict.txt")

    def state_dict(self):
        return {**super().state_dict(), DICTIONARY_KEY: dictionary_fingerprint(self.dictionary)}

    def load_state_dict(self, state_dict):
        # fairseq calls this with the checkpoint's task_state before it builds the model and loads the weights
        state = dict(state_dict)
        saved = state.pop(DICTIONARY_KEY, None)
        if saved is not None and self.dictionary is not None:
            check_dictionary(saved, self.dictionary, self.dictionary_file())
        super().load_state_dict(state)
