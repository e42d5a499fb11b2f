"""Batched generation where sentences end at different lengths: fairseq's generator drops the rows of finished
sentences, and when the dropped ones are the last rows the surviving order is ``0..k-1`` with k below the cached
batch. The cache must shrink with it, and the hypotheses must equal full recomputation's.

A prompt that holds an end-of-sentence token ends its sentence there (the generator forces prompt tokens, even an
end of sentence), and ``min_len`` keeps the others from ending on their own: the order in which sentences end is
then fixed for an untrained model.
"""

from __future__ import annotations

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.sequence_generator import SequenceGenerator

from tests.conftest import PACKAGE
from tests.test_generation_cache import KINDS, assert_same_hypotheses, tiny

GENERATED = 30  # past three windows of 8


def batch(task, rows: list[list[int]]) -> dict:
    """Prompts led by the end-of-sentence token and right-padded, as fairseq batches them; ``None`` = eos."""
    d = task.target_dictionary
    width = max(len(row) for row in rows) + 1
    tokens = torch.full((len(rows), width), d.pad())
    for i, row in enumerate(rows):
        tokens[i, : len(row) + 1] = torch.tensor([d.eos(), *(d.eos() if t is None else t for t in row)])
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([len(row) + 1 for row in rows])}}


# the last sentence ends first (after 2 tokens), then the third (after 6) while the first two run to the end: both
# times the finished rows are at the end of the batch
ENDING_LAST_FIRST = [[10, 11, 12, 13], [20, 21], [30, 31, 32, 33, 34, None], [40, None]]


def generate(task, model, rows, beam: int, cache: bool):
    model.decoder.use_cache = cache
    generator = SequenceGenerator(
        [model], task.target_dictionary, beam_size=beam, max_len_b=GENERATED, min_len=GENERATED
    )
    with torch.no_grad():
        return task.inference_step(generator, [model], batch(task, rows))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("beam", (1, 2))
def test_sentences_that_end_at_the_end_of_the_batch_first_generate_as_without_cache(lm_data, kind, beam):
    task, model = tiny(lm_data, kind)
    cached = generate(task, model, ENDING_LAST_FIRST, beam, cache=True)
    assert_same_hypotheses(cached, generate(task, model, ENDING_LAST_FIRST, beam, cache=False))
    lengths = [len(sentence[0]["tokens"]) for sentence in cached]
    assert lengths[3] == 2 and lengths[2] == 6 and min(lengths[:2]) > 6, lengths


def test_a_middle_sentence_ending_first_still_reorders_the_cache(lm_data):
    rows = [[10, 11, 12, 13], [20, None], [30, 31, 32]]
    task, model = tiny(lm_data, "cluster")
    assert_same_hypotheses(generate(task, model, rows, 1, cache=True), generate(task, model, rows, 1, cache=False))


def hub(data, kind: str) -> GeneratorHubInterface:
    task, model = tiny(data, kind)
    argv = [str(data), "--user-dir", str(PACKAGE), "--task", "clusterformer_lm"]
    args = options.parse_args_and_arch(options.get_generation_parser(), argv)
    return GeneratorHubInterface(convert_namespace_to_omegaconf(args), task, [model])


@pytest.mark.parametrize("kind", ("none", "cluster"))
def test_the_hub_generates_several_prompts_that_end_at_different_lengths(lm_data, kind):
    lm = hub(lm_data, kind)
    eos = lm.task.target_dictionary.eos()
    # the hub batches the shortest prompt first: the longest one, which ends after its second token, is the last row
    prompts = [torch.tensor([10, 11, eos]), torch.tensor([20, eos, 21, 22, 23, eos])]
    settings = {"beam": 1, "max_len_b": GENERATED, "min_len": GENERATED}
    cached = lm.generate(prompts, **settings)
    lm.models[0].decoder.use_cache = False
    assert_same_hypotheses(cached, lm.generate(prompts, **settings))
    assert len(cached[1][0]["tokens"]) == 2 and len(cached[0][0]["tokens"]) > 2
