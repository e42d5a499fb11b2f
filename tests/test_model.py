"""The registered model and task, built in-process through fairseq's own argument parser."""

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_clusterformer.layers.cluster import ClusterFormerLayer
from fairseq_clusterformer.layers.kinds import KINDS
from fairseq_clusterformer.layers.windowed import SlidingWindowLayer
from tests.conftest import PACKAGE


def parse(data, *extra, arch="clusterformer_lm_tiny"):
    parser = options.get_training_parser()
    argv = [
        str(data),
        "--user-dir",
        str(PACKAGE),
        "--task",
        "clusterformer_lm",
        "--arch",
        arch,
        "--dropout",
        "0",
        "--tokens-per-sample",
        "256",
        "--memory-size",
        "1000",
        *map(str, extra),
    ]
    return options.parse_args_and_arch(parser, argv)


def build(data, *extra, arch="clusterformer_lm_tiny"):
    cfg = convert_namespace_to_omegaconf(parse(data, *extra, arch=arch))
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model)


def test_architectures_put_cluster_layers_where_the_paper_does(lm_data):
    _, model = build(lm_data)
    kinds = [type(layer) for layer in model.decoder.layers]
    assert kinds == [SlidingWindowLayer, ClusterFormerLayer, SlidingWindowLayer, ClusterFormerLayer]
    small = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64"]
    _, model = build(lm_data, *small, arch="clusterformer_lm_enwik8")
    cluster_at = [i + 1 for i, layer in enumerate(model.decoder.layers) if isinstance(layer, ClusterFormerLayer)]
    assert (len(model.decoder.layers), cluster_at) == (16, [11, 15])
    eleventh = model.decoder.layers[10].settings
    assert (eleventh.window_size, eleventh.window_stride) == (256, 128)
    _, model = build(lm_data, "--long-range-layer", "none")
    assert not any(isinstance(layer, ClusterFormerLayer) for layer in model.decoder.layers)


def test_wiki103_architecture_is_the_papers(lm_data):
    parser = options.get_training_parser()
    argv = [str(lm_data), "--user-dir", str(PACKAGE), "--task", "clusterformer_lm"]
    argv += ["--arch", "clusterformer_lm_wiki103"]
    args = options.parse_args_and_arch(parser, argv)
    assert (args.decoder_layers, args.decoder_attention_heads, args.decoder_embed_dim, args.decoder_ffn_embed_dim) == (
        16,
        8,
        1024,
        4096,
    )
    assert args.adaptive_input and args.tie_adaptive_weights and args.adaptive_softmax_cutoff == "20000,60000"
    assert (args.dropout, args.long_range_layers, args.window_size, args.window_stride) == (0.3, "11,15", 256, 128)
    assert (args.num_clusters, args.cluster_causality) == (512, "strict")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--window-stride", "64", "--window-size", "64"], "--window-stride"),
        (["--long-range-layers", "2,5"], "--long-range-layers"),
        (["--long-range-layers", "0"], "--long-range-layers"),
        (["--long-range-layers", "two"], "--long-range-layers"),
        (["--num-clusters", "2000"], "--num-clusters"),
        (["--memory-size", "0"], "--memory-size"),
    ],
)
def test_bad_flags_name_the_flag(lm_data, flags, message):
    with pytest.raises(ValueError, match=message):
        build(lm_data, *flags)


def test_unknown_causality_is_refused_by_the_parser(lm_data, capsys):
    with pytest.raises(SystemExit):
        build(lm_data, "--cluster-causality", "sometimes")
    assert "--cluster-causality" in capsys.readouterr().err


@pytest.mark.parametrize("causality", ["strict", "paper"])
def test_log_probs_never_depend_on_padding(lm_data, causality):
    task, model = build(lm_data, "--cluster-causality", causality, "--window-size", "16", "--window-stride", "8")
    model.eval()
    torch.manual_seed(0)
    for layer in model.decoder.long_range_layers():
        layer.set_centroids(torch.nn.functional.normalize(torch.randn_like(layer.centroids), dim=-1))
    pad = task.dictionary.pad()
    short = torch.randint(4, len(task.dictionary), (1, 37))
    batch = torch.full((2, 70), pad)
    batch[0, :37] = short[0]
    batch[1] = torch.randint(4, len(task.dictionary), (70,))
    with torch.no_grad():
        alone = model.get_normalized_probs(model(short), log_probs=True)
        padded = model.get_normalized_probs(model(batch), log_probs=True)
    assert torch.allclose(alone[0], padded[0, :37], atol=1e-5)


def test_pads_never_enter_the_memory_bank(lm_data):
    task, model = build(lm_data)
    model.train()
    pad = task.dictionary.pad()
    tokens = torch.randint(4, len(task.dictionary), (2, 40))
    tokens[0, 25:] = pad
    model(tokens)
    task.refresher.commit()  # what the task's train_step does after every micro-batch
    for bank in task.refresher.banks:
        assert len(bank) == 40 + 25
    model.eval()
    model(tokens)  # evaluation never writes to the bank
    task.refresher.commit()
    assert all(len(bank) == 65 for bank in task.refresher.banks)


def test_centroids_are_in_the_state_dict_and_a_mismatch_names_the_flag(lm_data):
    _, model = build(lm_data)
    state = model.state_dict()
    keys = [k for k in state if k.endswith("centroids")]
    assert keys == ["decoder.layers.1.centroids", "decoder.layers.3.centroids"]
    assert state[keys[0]].shape == (16, 64)
    _, other = build(lm_data, "--num-clusters", "8")
    with pytest.raises(ValueError, match="--num-clusters"):
        other.load_state_dict(state)


@pytest.mark.parametrize("kind,layer_type", [(name, kind.layer) for name, kind in KINDS.items()])
@pytest.mark.parametrize("merge", ["layer", "attention"])
def test_every_long_range_kind_and_merge_builds_from_the_flags_and_trains_a_step(lm_data, kind, layer_type, merge):
    _, model = build(lm_data, "--long-range-layer", kind, "--window-merge", merge)
    kinds = [type(layer) for layer in model.decoder.layers]
    assert kinds == [SlidingWindowLayer, layer_type, SlidingWindowLayer, layer_type]
    assert all(layer.settings.window_merge == merge for layer in model.decoder.layers)
    model.train()
    tokens = torch.randint(4, 100, (2, 150))
    logits, _ = model(tokens)
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_an_odd_lsh_bucket_count_names_the_flag(lm_data):
    with pytest.raises(ValueError, match="--num-clusters"):
        build(lm_data, "--long-range-layer", "lsh", "--num-clusters", "15")
