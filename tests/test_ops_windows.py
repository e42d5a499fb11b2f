"""Windowing, sorting and masking in ops/: pure tensor properties."""

import ast
import pathlib

import pytest
import torch

from fairseq_clusterformer.ops.attention import masked_attention, reference_attention
from fairseq_clusterformer.ops.clustering import (
    assign_clusters,
    cluster_size_entropy,
    gather_tokens,
    inverse_permutation,
    permute_tokens,
    sort_window_unsort,
    stable_sort,
)
from fairseq_clusterformer.ops.window_scheme import Windowing, WindowScheme
from fairseq_clusterformer.ops.windows import coverage, merge_windows, window_index
from fairseq_clusterformer.qa.ops.windows import QAInputWindows, QALayout, QAWindows


def test_ops_never_import_fairseq():
    for path in pathlib.Path("fairseq_clusterformer/ops").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "fairseq" or n.startswith("fairseq.") for n in names), f"{path} imports fairseq"


@pytest.mark.parametrize("length,size,stride", [(1, 4, 2), (7, 4, 2), (8, 4, 2), (33, 8, 3), (10, 6, 5)])
def test_coverage_counts_windows_containing_each_position(length, size, stride):
    index = window_index(length, size, stride).reshape(-1)
    expected = torch.bincount(index, minlength=length)[:length]
    assert torch.equal(coverage(length, size, stride, None, torch.long), expected)
    assert (expected >= 1).all()


def test_merge_of_identical_windows_is_identity():
    x = torch.randn(2, 13, 3)
    scheme = WindowScheme(5, 2, 13)
    assert torch.allclose(scheme.merge(scheme.queries(x)), x)
    band = WindowScheme(5, 2, 13, band=True)
    assert torch.equal(band.merge(band.queries(x)), x)


def test_every_window_scheme_is_a_windowing():
    layout = QALayout(3, 10, 4, 3)
    for scheme in (
        WindowScheme(5, 2, 13),
        WindowScheme(5, 2, 13, band=True),
        QAWindows(layout),
        QAInputWindows(layout),
    ):
        assert isinstance(scheme, Windowing), type(scheme).__name__
    assert not isinstance(layout, Windowing), "a layout cuts nothing into windows by itself"


def test_merge_averages_overlaps():
    windows = torch.arange(4.0).view(1, 4, 1, 1).expand(1, 4, 4, 1)  # window k holds the value k
    merged = merge_windows(windows, 8, 4, 2)[0, :, 0]
    # a window starts at every stride below T, the last one half past the end:
    # positions 0-1 lie in window 0; 2-3 in 0,1; 4-5 in 1,2; 6-7 in 2,3
    assert merged.tolist() == [0.0, 0.0, 0.5, 0.5, 1.5, 1.5, 2.5, 2.5]


def test_sort_and_unsort_are_inverse_and_stable():
    keys = torch.randint(0, 4, (3, 50))
    sorted_keys, order = stable_sort(keys)
    x = torch.randn(3, 50, 2)
    assert torch.equal(gather_tokens(gather_tokens(x, order), inverse_permutation(order)), x)
    assert torch.equal(sorted_keys, gather_tokens(keys, order))
    assert (sorted_keys[:, 1:] >= sorted_keys[:, :-1]).all()
    same = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    assert (order[:, 1:] > order[:, :-1])[same].all(), "ties must keep position order"


@pytest.mark.parametrize("sort", [True, False])
def test_the_window_pass_gets_the_sorted_tokens_with_their_positions_and_its_rows_go_back_unsorted(sort):
    keys = torch.randint(0, 4, (3, 20))
    order = stable_sort(keys)[1] if sort else None
    x = torch.randn(3, 20, 2)
    valid = torch.rand(3, 20) > 0.2
    seen = {}

    def window_pass(tokens, sorted_valid, positions):
        seen.update(tokens=tokens, valid=sorted_valid, positions=positions)
        return tokens * 2 + positions[..., None]  # row i: sorted token i, marked with its original position

    out = sort_window_unsort(x, valid, order, window_pass)
    identity = torch.arange(20).expand(3, 20)
    assert torch.equal(seen["positions"], order if sort else identity)
    assert torch.equal(seen["tokens"], gather_tokens(x, seen["positions"]))
    assert torch.equal(seen["valid"], gather_tokens(valid, seen["positions"]))
    assert torch.equal(out, x * 2 + identity[..., None])  # every token's row back at its own position


@pytest.mark.parametrize("shape", [(3, 50, 2), (2, 4, 30, 5)])  # B x T x C, and B x H x T x d per head
def test_permuting_gives_the_gathers_values_and_gradients_without_a_scatter_add(shape):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    rows = torch.Size(shape[:-2]).numel()
    order = torch.stack([torch.randperm(shape[-2]) for _ in range(rows)]).view(*shape[:-1])  # a permutation a row
    inverse = inverse_permutation(order)
    index = order[..., None].expand(shape)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(shape, dtype=torch.float64)
    expected = torch.autograd.grad(torch.gather(x, -2, index), x, grad)[0]  # a gather's backward: a scatter-add
    out = permute_tokens(x, order, inverse)
    assert torch.equal(out, torch.gather(x, -2, index))
    with Ops() as ops:
        (got,) = torch.autograd.grad(out, x, grad)
    assert torch.equal(got, expected)
    assert not [n for n in ops.names if "scatter" in n], ops.names
    assert torch.equal(permute_tokens(out, inverse, order), x)  # unsorted back


def test_assignment_is_cosine_argmax_and_pads_go_last():
    centroids = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    x = torch.tensor([[[10.0, 1.0], [0.1, 0.5], [3.0, 3.1], [5.0, 0.0]]])
    pad = torch.tensor([[False, False, False, True]])
    assert assign_clusters(x, centroids, pad).tolist() == [[0, 1, 1, 2]]
    # scale does not matter, only direction
    assert torch.equal(assign_clusters(x * 100, centroids), assign_clusters(x, centroids))


def test_entropy_of_cluster_sizes():
    uniform = torch.arange(8).view(1, 8)
    assert cluster_size_entropy(uniform, 8).item() == pytest.approx(3.0)
    assert cluster_size_entropy(torch.zeros(1, 8, dtype=torch.long), 8).item() == pytest.approx(0.0)
    pad = torch.tensor([[False] * 4 + [True] * 4])
    assert cluster_size_entropy(torch.tensor([[0, 0, 1, 1, 8, 8, 8, 8]]), 8, pad).item() == pytest.approx(1.0)


def test_masked_attention_matches_explicit_softmax():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 8)
    allowed = torch.rand(3, 5, 7) > 0.5
    allowed[..., 0] = True
    assert torch.allclose(masked_attention(q, k, v, allowed, 2), reference_attention(q, k, v, allowed, 2), atol=1e-6)


@pytest.mark.parametrize("band", [False, True])
def test_masks_never_leave_a_row_empty(band):
    length = 11
    positions = torch.arange(length).expand(2, -1)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, 6:] = False
    ids = torch.randint(0, 3, (2, length)).masked_fill(~valid, 3)
    mask = WindowScheme(4, 2, length, band=band).mask(positions, valid, True, ids if band else None)
    assert mask.any(-1).all()


def test_band_mask_links_a_token_to_its_recent_same_cluster_predecessors():
    ids = torch.tensor([[0, 0, 0, 0, 1, 1]])  # already sorted
    positions = torch.tensor([[0, 2, 3, 5, 1, 4]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    scheme = WindowScheme(3, 2, 6, band=True)  # reach 3: self + 2 predecessors
    mask = scheme.mask(positions, valid, True, ids)  # 1 x K x m x (l-1+m)
    ranks = scheme.keys(torch.arange(scheme.padded).view(1, -1), -1)
    seen = {}
    for k in range(scheme.count):
        for j in range(scheme.stride):
            q = k * scheme.stride + j
            if q < 6:
                seen[q] = sorted(int(r) for r in ranks[0, k][mask[0, k, j]])
    assert seen == {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [1, 2, 3], 4: [4], 5: [4, 5]}
