"""The Cluster-Former language-modeling task: fairseq's language_modeling plus the memory-bank K-Means hook."""

from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fairseq_clusterformer.checkpoints.old_layouts import drop_task_dictionary_hash
from fairseq_clusterformer.compat.autocast_bf16 import AutocastBF16Config, AutocastBF16Hooks
from fairseq_clusterformer.compat.loss_scaler import LossScalerResumeHooks
from fairseq_clusterformer.refresh.task_hooks import CentroidRefreshHooks, MemoryBankConfig


@dataclass
class ClusterFormerLMTaskConfig(LanguageModelingConfig, MemoryBankConfig, AutocastBF16Config):
    pass


@register_task("clusterformer_lm", dataclass=ClusterFormerLMTaskConfig)
class ClusterFormerLMTask(LossScalerResumeHooks, CentroidRefreshHooks, AutocastBF16Hooks, LanguageModelingTask):
    """Language modeling whose training fills the memory banks and refreshes the centroids with K-Means."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        # fairseq itself would stop on a ZeroDivisionError (0) or a RuntimeError of torch.arange (< 0) in its dataset
        if args.tokens_per_sample <= 0:
            raise ValueError(f"--tokens-per-sample must be a positive number of tokens, got {args.tokens_per_sample}")
        super().__init__(args, dictionary, output_dictionary, targets)
        self.init_centroid_refresh(args)

    def get_batch_iterator(self, dataset, *args, epoch=1, seed=1, **kwargs):
        """fairseq's iterator, with the batches an uninterrupted run would see in every epoch.

        fairseq orders a dataset's examples under the seed ``seed + epoch`` of the epoch the iterator is built in, and
        freezes that order for every later epoch (only the batch order is reshuffled per epoch). An uninterrupted run
        builds its training iterator once, in epoch 1; a run resumed in epoch 2 or later builds it in that epoch, so
        it ordered the examples otherwise and saw other batches from then on. An iterator that is kept across epochs
        is therefore always ordered as in epoch 1 (and seeded as then with --update-ordered-indices-seed). One that is
        rebuilt every epoch (sharded data, --update-epoch-batch-itr) is built in the same epoch by both runs already.
        """
        kept = (
            not kwargs.get("disable_iterator_cache", False)
            and not kwargs.get("update_epoch_batch_itr", False)
            and self.can_reuse_epoch_itr(dataset)
        )
        if not kept or epoch <= 1 or dataset in self.dataset_to_epoch_iter:
            return super().get_batch_iterator(dataset, *args, epoch=epoch, seed=seed, **kwargs)
        if seed == self.args.seed + epoch:  # --update-ordered-indices-seed: the trainer passes --seed + epoch
            seed = self.args.seed + 1
        iterator = super().get_batch_iterator(dataset, *args, epoch=1, seed=seed, **kwargs)
        # what building it in ``epoch`` sets; a resume then loads the epoch and position from the checkpoint
        iterator.epoch = epoch
        dataset.set_epoch(epoch)
        return iterator

    def load_state_dict(self, state_dict):
        super().load_state_dict(drop_task_dictionary_hash(state_dict))  # an old checkpoint's hash (old_layouts.py)
