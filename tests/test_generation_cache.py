"""Cached generation (``incremental_state``) against full recomputation of the prefix at every step.

B = batch, T = tokens, V = vocabulary.

Tokens must match exactly. Scores and states match to float rounding only: a cached step attends over the cached
keys alone while the full pass attends over masked windows, so the softmax sums the same terms in another order.
"""

from __future__ import annotations

import logging

import pytest
import torch
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.sequence_generator import SequenceGenerator

from fairseq_clusterformer.layers.kinds import KINDS as LAYER_KINDS
from fairseq_clusterformer.layers.kinds import NO_LONG_RANGE
from fairseq_clusterformer.lm.decoder import CACHE_KEY
from fairseq_clusterformer.lm.model import ClusterFormerLanguageModel
from fairseq_clusterformer.ops.step_cache import empty_rows, gather_rows, push_rows, ring_filled, step_window_mask
from tests.conftest import PACKAGE, TINY_LM_TRAIN, run_ok
from tests.test_model import build

WINDOW, STRIDE = 8, 4
SMALL = ["--window-size", WINDOW, "--window-stride", STRIDE, "--num-clusters", 8, "--cluster-groups", 2]
KINDS = (NO_LONG_RANGE, *LAYER_KINDS)
MERGES = ("layer", "attention")
GENERATED = 40  # five windows past the longer prompt
TIGHT = {"rtol": 1e-5, "atol": 5e-5}


def tiny(data, kind: str, merge: str = "layer", causality: str = "strict"):
    torch.manual_seed(0)
    task, model = build(
        data, *SMALL, "--long-range-layer", kind, "--window-merge", merge, "--cluster-causality", causality
    )
    return task, model.eval()


def prompts(task) -> dict:
    """Two prompts of different lengths, right-padded and led by the end-of-sentence token, as fairseq batches them."""
    d = task.target_dictionary
    tokens = torch.tensor([[d.eos(), 10, 11, 12, 13, 14], [d.eos(), 20, 21, d.pad(), d.pad(), d.pad()]])
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([6, 3])}}


def generate(task, model, beam: int, cache: bool, length: int = GENERATED):
    model.decoder.use_cache = cache
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=length, min_len=length)
    with torch.no_grad():
        return task.inference_step(generator, [model], prompts(task))


def assert_same_hypotheses(cached, full) -> None:
    assert [len(s) for s in cached] == [len(s) for s in full]
    for sentence_cached, sentence_full in zip(cached, full):
        for a, b in zip(sentence_cached, sentence_full):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"], **TIGHT)


def step_by_step(decoder, tokens: torch.Tensor, state: dict, start: int = 0) -> torch.Tensor:
    """B x T x V log-probability inputs of positions start..T-1, one cached decoder call per token."""
    with torch.no_grad():
        return torch.cat(
            [decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(start, tokens.size(1))], 1
        )


def assert_cache_is_exact(task, model, beam: int = 3, length: int = 43) -> None:
    """Generation from the cache gives the hypotheses of full recomputation, and a sequence fed one token per call
    gives the full pass at every position."""
    assert_same_hypotheses(generate(task, model, beam, cache=True), generate(task, model, beam, cache=False))
    tokens = torch.randint(4, len(task.target_dictionary), (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model.decoder(tokens)[0]  # B x T x V
    model.decoder.use_cache = True  # generate(cache=False) turned it off
    torch.testing.assert_close(step_by_step(model.decoder, tokens, {}), full, **TIGHT)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("beam", (1, 3))
def test_cached_generation_gives_the_tokens_and_scores_of_full_recomputation(lm_data, kind, merge, beam):
    task, model = tiny(lm_data, kind, merge)
    cached = generate(task, model, beam, cache=True)
    assert_same_hypotheses(cached, generate(task, model, beam, cache=False))
    assert all(h["tokens"].numel() == GENERATED + 1 for sentence in cached for h in sentence)
    assert cached[0][0]["tokens"][:5].tolist() == [10, 11, 12, 13, 14]  # the prompts were forced
    assert cached[1][0]["tokens"][:2].tolist() == [20, 21]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("merge", MERGES)
def test_cached_states_are_the_full_pass_at_every_position(lm_data, kind, merge):
    """Every position of a sequence ten windows long, fed one token per call, or several tokens in one call."""
    task, model = tiny(lm_data, kind, merge)
    tokens = torch.randint(
        4, len(task.target_dictionary), (2, 10 * WINDOW + 3), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        full = model.decoder(tokens)[0]  # B x T x V
    torch.testing.assert_close(step_by_step(model.decoder, tokens, {}), full, **TIGHT)
    state = {}
    with torch.no_grad():
        first = model.decoder(tokens[:, :13], incremental_state=state)[0]  # a prompt in one call: B x 13 x V
    torch.testing.assert_close(torch.cat([first, step_by_step(model.decoder, tokens, state, 13)], 1), full, **TIGHT)


@pytest.mark.parametrize("kind", ("none", "cluster"))
def test_a_wrong_cache_gives_other_outputs(lm_data, kind):
    """The comparison can fail: forget the long-range layers' past, or the window layers' cached values."""
    task, model = tiny(lm_data, kind)
    tokens = torch.randint(4, len(task.target_dictionary), (2, 6 * WINDOW), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model.decoder(tokens)[0]
    state = {}
    step_by_step(model.decoder, tokens[:, : 4 * WINDOW], state)
    cache = model.decoder.get_incremental_state(state, CACHE_KEY)
    for name in list(cache):
        if name.endswith(".count"):
            cache[name] = torch.zeros_like(cache[name])  # every group row empty again
        elif name.endswith(".v"):
            cache[name] = torch.zeros_like(cache[name])
    wrong = step_by_step(model.decoder, tokens, state, 4 * WINDOW)
    assert not torch.allclose(wrong, full[:, 4 * WINDOW :], **TIGHT)


def cache_bytes(decoder, state: dict) -> int:
    cache = decoder.get_incremental_state(state, CACHE_KEY)
    # every entry is a tensor but the length, a host int (reading a tensor would be a host sync per step)
    return sum(t.numel() * t.element_size() for t in cache.values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_stops_growing_after_one_window(lm_data, kind):
    task, model = tiny(lm_data, kind)
    tokens = torch.randint(4, len(task.target_dictionary), (3, 30 * WINDOW), generator=torch.Generator().manual_seed(3))
    state, sizes = {}, []
    with torch.no_grad():
        for t in range(tokens.size(1)):
            model.decoder(tokens[:, : t + 1], incremental_state=state)
            sizes.append(cache_bytes(model.decoder, state))
    assert sizes[WINDOW] > sizes[0]
    assert len(set(sizes[WINDOW:])) == 1, "the cache grows with the generated length"
    # far below the keys and values of the whole sequence that a transformer's cache would hold by now
    full_cache = len(model.decoder.layers) * 2 * tokens.numel() * model.decoder.embed_dim * 4
    assert sizes[-1] < full_cache / 4


def test_paper_causality_recomputes_the_prefix_and_warns_once(lm_data, caplog):
    task, model = tiny(lm_data, "cluster", causality="paper")
    tokens = torch.randint(4, len(task.target_dictionary), (1, 12))
    with caplog.at_level(logging.WARNING):
        state = {}
        with torch.no_grad():
            for t in range(1, tokens.size(1) + 1):
                out = model.decoder(tokens[:, :t], incremental_state=state)[0]
                assert out.size(1) == t  # every position, recomputed
    warnings = [r for r in caplog.records if "--cluster-causality paper" in r.getMessage()]
    assert len(warnings) == 1
    assert model.decoder.get_incremental_state(state, CACHE_KEY) is None
    assert_same_hypotheses(generate(task, model, 2, cache=True, length=12), generate(task, model, 2, False, 12))


def test_window_step_mask_is_the_full_window_mask_of_the_new_token():
    """Each window containing t sees keys from its start to t: row k of the mask against window k's range."""
    size, stride = 6, 2
    for t in range(20):
        keys = min(t + 1, size)
        mask = step_window_mask(t, keys, size, stride)
        starts = [k * stride for k in range(t // stride + 1) if k * stride + size > t]
        expected = [[start <= p for p in range(t - keys + 1, t + 1)] for start in starts]
        assert mask.tolist() == expected


def test_ring_rows_keep_the_newest_entries_of_each_row():
    kv, counts = empty_rows(2, 3, 4, 1, torch.zeros(1))  # B=2, R=3 rows of 4 slots, width 1
    for value in range(1, 8):
        rows = torch.tensor([[0, 2], [1, 2]])  # batch row 0 writes rows 0 and 2, batch row 1 rows 1 and 2
        push_rows(kv, counts, rows, torch.full((2, 2, 2, 1), float(value)))
    held = gather_rows(kv, torch.tensor([[0], [1]]))[:, 0, :, 0, 0]  # B x 4
    assert sorted(held[0].tolist()) == [4.0, 5.0, 6.0, 7.0] and sorted(held[1].tolist()) == [4.0, 5.0, 6.0, 7.0]
    assert counts.tolist() == [[7, 0, 7], [0, 7, 7]]
    assert ring_filled(torch.tensor([[2]]), 4).tolist() == [[[True, True, False, False]]]


@pytest.fixture(scope="module")
def strict_checkpoint(lm_data, tmp_path_factory):
    """A strict Cluster-Former LM whose centroids and cluster shares three K-Means refreshes have set."""
    save = tmp_path_factory.mktemp("generation-ckpt")
    out = run_ok(
        "fairseq-train", lm_data, *TINY_LM_TRAIN, "--window-size", 16, "--window-stride", 8, "--memory-size", 2000,
        "--kmeans-iters", 5, "--cluster-update-interval", 10, "--max-update", 40, "--save-dir", save,
        "--no-epoch-checkpoints", "--seed", 1, "--log-format", "simple",
    )  # fmt: skip
    assert "kmeans_refreshes 3" in out, out[-2000:]
    return save


@pytest.mark.e2e
def test_the_hub_samples_and_scores_from_a_refreshed_checkpoint_as_full_recomputation_does(strict_checkpoint, lm_data):
    lm = ClusterFormerLanguageModel.from_pretrained(str(strict_checkpoint), "checkpoint_last.pt", str(lm_data))
    assert isinstance(lm, GeneratorHubInterface)
    clustered = [layer for layer in lm.models[0].decoder.layers if hasattr(layer, "refreshes")]
    assert clustered and all(int(layer.refreshes) == 3 for layer in clustered)
    assert not torch.allclose(clustered[0].shares, torch.full_like(clustered[0].shares, 1 / 16))  # fitted shares
    prompts = [lm.encode("The game was"), lm.encode("In the first season of the")]
    options = {"beam": 2, "max_len_b": 60, "min_len": 60}  # 60 tokens: almost four windows of 16
    cached = lm.generate(prompts, **options)
    lm.models[0].decoder.use_cache = False
    assert_same_hypotheses(cached, lm.generate(prompts, **options))
    lm.models[0].decoder.use_cache = True
    assert lm.sample("The game was", beam=1, max_len_b=20).startswith("The game was ")
    scores = lm.score("The game was played in the first season .")["positional_scores"]
    assert scores.shape == (9,) and torch.isfinite(scores).all()  # eight words and the end of the sentence


@pytest.mark.e2e
def test_fairseq_interactive_generates_with_the_user_dir(strict_checkpoint, lm_data, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The game was\nIn the first season of the\n")
    out = run_ok(
        "fairseq-interactive", lm_data, "--user-dir", PACKAGE, "--task", "clusterformer_lm",
        "--path", strict_checkpoint / "checkpoint_last.pt", "--beam", 2, "--max-len-b", 40, "--input", prompts,
    )  # fmt: skip
    hypotheses = [line.split("\t")[2] for line in out.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 2
    assert sorted(h.split()[:3] for h in hypotheses) == [["In", "the", "first"], ["The", "game", "was"]]
