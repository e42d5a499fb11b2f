import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_clusterformer.refresh.memory_bank import MemoryBank


def rows(start: int, stop: int, dim: int = 3) -> torch.Tensor:
    """Rows whose every entry is the row's number, so positions are readable in failures."""
    return torch.arange(start, stop, dtype=torch.float32).unsqueeze(1).expand(-1, dim).contiguous()


def test_fifo_keeps_last_rows_in_order_across_wrap_around():
    bank = MemoryBank(capacity=5)
    assert len(bank) == 0 and bank.dim is None
    bank.add(rows(0, 3))
    assert len(bank) == 3
    assert torch.equal(bank.contents(), rows(0, 3))
    bank.add(rows(3, 6))
    bank.add(rows(6, 8))
    assert len(bank) == 5 and bank.dim == 3 and bank.total_seen == 8
    assert torch.equal(bank.contents(), rows(3, 8))


def test_batch_larger_than_capacity_keeps_its_last_rows():
    bank = MemoryBank(capacity=4)
    bank.add(rows(0, 2))
    bank.add(rows(2, 12))
    assert torch.equal(bank.contents(), rows(8, 12))
    assert bank.total_seen == 12


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 9), sizes=st.lists(st.integers(0, 12), max_size=8))
def test_contents_equal_the_tail_of_everything_added(capacity, sizes):
    bank = MemoryBank(capacity=capacity, dim=3)
    start = 0
    for size in sizes:
        bank.add(rows(start, start + size))
        start += size
    assert torch.equal(bank.contents(), rows(max(0, start - capacity), start))


def test_stores_float32_on_the_first_states_device():
    bank = MemoryBank(capacity=4)
    bank.add(rows(0, 2).double())
    assert bank.contents().dtype == torch.float32
    assert bank.device == torch.device("cpu")


def test_nonfinite_rows_are_dropped_and_counted():
    bank = MemoryBank(capacity=10)
    states = rows(0, 6)
    states[1, 0] = float("nan")
    states[4, 2] = float("inf")
    assert bank.add(states) == 2
    assert bank.add(rows(6, 7)) == 0
    bad = rows(7, 8)
    bad[0, 1] = -float("inf")
    assert bank.add(bad) == 1
    assert bank.num_nonfinite_dropped == 3
    assert torch.equal(bank.contents(), rows(0, 7)[[0, 2, 3, 5, 6]])


def test_sample_per_batch_keeps_k_input_rows_in_order():
    bank = MemoryBank(capacity=100, sample_per_batch=4, seed=3)
    bank.add(rows(0, 20))
    kept = bank.contents()[:, 0]
    assert len(kept) == 4
    assert len(set(kept.tolist())) == 4 and set(kept.tolist()) <= set(range(20))
    assert torch.equal(kept, kept.sort().values)
    bank.add(rows(20, 22))  # fewer rows than the sample size: all kept
    assert len(bank) == 6


def test_sampling_is_seeded():
    first, second, other = MemoryBank(50, 5, seed=1), MemoryBank(50, 5, seed=1), MemoryBank(50, 5, seed=2)
    for bank in (first, second, other):
        bank.add(rows(0, 30))
    assert torch.equal(first.contents(), second.contents())
    assert not torch.equal(first.contents(), other.contents())


def test_no_autograd_graph_is_kept():
    states = torch.randn(6, 3, requires_grad=True)
    bank = MemoryBank(capacity=4)
    bank.add(states * 2)
    assert not bank.contents().requires_grad
    assert bank.contents().grad_fn is None


def test_state_dict_round_trip_resumes_exactly():
    bank = MemoryBank(capacity=7, sample_per_batch=3, seed=11)
    for start in range(0, 40, 10):
        bank.add(rows(start, start + 10))
    bad = rows(40, 41)
    bad[0, 0] = float("nan")
    bank.add(bad)
    state = bank.state_dict()
    assert state["buffer"].device == torch.device("cpu")

    resumed = MemoryBank(capacity=7, sample_per_batch=3, seed=999)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.contents(), bank.contents())
    assert (len(resumed), resumed.total_seen, resumed.num_nonfinite_dropped) == (7, 12, 1)
    for start in range(50, 90, 10):
        bank.add(rows(start, start + 10))
        resumed.add(rows(start, start + 10))
        assert torch.equal(resumed.contents(), bank.contents())


def test_state_dict_of_an_empty_bank():
    resumed = MemoryBank(capacity=3)
    resumed.load_state_dict(MemoryBank(capacity=3).state_dict())
    assert len(resumed) == 0 and resumed.dim is None


def test_load_rejects_other_capacity_or_dim():
    bank = MemoryBank(capacity=5)
    bank.add(rows(0, 2, dim=3))
    with pytest.raises(ValueError, match="capacity 5"):
        MemoryBank(capacity=6).load_state_dict(bank.state_dict())
    with pytest.raises(ValueError, match="dim 3"):
        MemoryBank(capacity=5, dim=4).load_state_dict(bank.state_dict())


def test_add_rejects_other_dim():
    bank = MemoryBank(capacity=5, dim=3)
    with pytest.raises(ValueError, match="dim 3"):
        bank.add(torch.zeros(2, 4))


def test_clear_empties_but_keeps_counters():
    bank = MemoryBank(capacity=5)
    bank.add(rows(0, 4))
    bank.clear()
    assert len(bank) == 0 and bank.contents().shape == (0, 3)
    bank.add(rows(4, 6))
    assert torch.equal(bank.contents(), rows(4, 6))
    assert bank.total_seen == 6


def test_pick_then_append_equals_add():
    # the distributed path samples before exchanging states (pick), then appends; one process adds: same bank
    added, picked = MemoryBank(20, sample_per_batch=4, seed=5), MemoryBank(20, sample_per_batch=4, seed=5)
    for start in range(0, 40, 10):
        batch = rows(start, start + 10)
        added.add(batch)
        keep = picked.pick(batch.size(0))
        picked.append(batch[keep])
    assert torch.equal(added.contents(), picked.contents())
    assert picked.pick(3) is None  # fewer rows than the sample size: keep them all


def test_resumed_banks_go_to_their_layers_device_before_the_first_add():
    """A checkpoint keeps the rows on the CPU; after a resume they must sit where the layer is (its GPU in training),
    or a refresh due before the first ``add`` snapshots CPU rows and runs K-Means on the CPU (other centroids than
    the uninterrupted run's). The meta device stands in for a GPU: the test needs no accelerator."""
    from fairseq_clusterformer.refresh.layer_banks import LayerBanks

    class Layer(torch.nn.Module):  # what a bank needs of its layer: a module (it hooks it), clusters, centroids
        num_clusters = 2

        def __init__(self):
            super().__init__()
            self.register_buffer("centroids", torch.zeros(2, 3, device="meta"))

    saved = MemoryBank(capacity=4)
    saved.add(rows(0, 3))
    banks = LayerBanks([Layer()], capacity=4, sample_per_batch=0, seed=1)
    banks.load_state_dict([saved.state_dict()])
    assert banks[0].device == torch.device("meta")
    assert banks.snapshots()[0].device == torch.device("meta")
    assert banks.snapshots()[0].shape == (3, 3)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 9),
    batches=st.lists(st.lists(st.sampled_from(["real", "pad", "nan"]), max_size=12), max_size=6),
)
def test_masked_add_equals_adding_only_the_real_finite_rows(capacity, batches):
    """The fixed-shape write (a mask, no boolean index) keeps exactly what adding the real, finite rows alone
    keeps, and counts only the real rows with NaN/Inf (a pad is not a state, whatever it holds)."""
    masked, reference = MemoryBank(capacity=capacity), MemoryBank(capacity=capacity)
    start, nan_real = 0, 0
    for kinds in batches:
        states = rows(start, start + len(kinds))
        valid = torch.tensor([kind != "pad" for kind in kinds], dtype=torch.bool)
        states[[i for i, kind in enumerate(kinds) if kind == "nan"], 0] = float("nan")
        states[[i for i, kind in enumerate(kinds) if kind == "pad"], 1] = float("inf")
        dropped = masked.add(states, valid)
        assert int(dropped) == kinds.count("nan")
        nan_real += kinds.count("nan")
        reference.add(states[[i for i, kind in enumerate(kinds) if kind == "real"]])
        start += len(kinds)
    assert torch.equal(masked.contents(), reference.contents())
    assert (len(masked), masked.total_seen, masked.num_nonfinite_dropped) == (
        len(reference),
        reference.total_seen,
        nan_real,
    )
    resumed = MemoryBank(capacity=capacity)
    resumed.load_state_dict(masked.state_dict())
    assert torch.equal(resumed.contents(), reference.contents())


def test_a_deep_copy_keeps_the_contents_and_the_subsampling_generator_apart_from_the_original():
    """fairseq's model EMA deep-copies the model the banks hang on; torch 2.0 cannot deep-copy a torch.Generator."""
    import copy

    bank = MemoryBank(capacity=20, sample_per_batch=3, seed=5, dim=4)
    bank.add(torch.randn(10, 4))
    twin = copy.deepcopy(bank)
    assert twin._generator is not bank._generator
    assert torch.equal(twin.contents(), bank.contents())
    states = torch.randn(10, 4)
    bank.add(states)
    twin.add(states)
    assert torch.equal(twin.contents(), bank.contents())  # the same rows drawn: the generator's state was copied
    twin.add(torch.randn(10, 4))
    assert len(twin) == 9 and len(bank) == 6  # and the copy's buffer is its own
