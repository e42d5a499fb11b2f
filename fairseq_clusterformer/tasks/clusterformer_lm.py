"""The Cluster-Former language-modeling task: fairseq's language_modeling plus the memory-bank K-Means hook."""

from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fairseq_clusterformer.tasks.centroid_hooks import CentroidRefreshHooks, MemoryBankConfig


@dataclass
class ClusterFormerLMTaskConfig(LanguageModelingConfig, MemoryBankConfig):
    pass


@register_task("clusterformer_lm", dataclass=ClusterFormerLMTaskConfig)
class ClusterFormerLMTask(CentroidRefreshHooks, LanguageModelingTask):
    """Language modeling whose training fills the memory banks and refreshes the centroids with K-Means."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.init_centroid_refresh(args)
