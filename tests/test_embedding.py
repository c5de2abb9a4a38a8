"""Embedding (notebook 02) against F.embedding, hand-computed lookups and gradients, every integer dtype as ids
(never as a mask), its init statistics and its errors for float, bool and out-of-range ids."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, FLOAT_DTYPES, LEADING_SHAPES
from torch.func import functional_call

from transformer_from_scratch import Embedding

TRUNCATED_STD = 0.98658  # std of N(0, 1) truncated to [-3, 3]
INTEGER_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                  torch.uint64]


def hand_table() -> Embedding:
    """V = 5, d = 3 with weight rows (0, 1, 2), (3, 4, 5), ..., (12, 13, 14): row t is (3t, 3t+1, 3t+2)."""
    emb = Embedding(5, 3)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(15.0).reshape(5, 3))
    return emb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("leading", LEADING_SHAPES, ids=str)
def test_matches_f_embedding(device, dtype, leading):
    torch.manual_seed(0)
    emb = Embedding(50, 8, device=device, dtype=dtype)
    ids = torch.randint(0, 50, leading, device=device)
    out = emb(ids)
    assert out.shape == (*leading, 8) and out.dtype == dtype and out.device.type == device
    assert torch.equal(out, F.embedding(ids, emb.weight))  # both copy rows: equal bit for bit


def test_hand_computed_lookups():
    emb = hand_table()
    assert emb(torch.tensor([2, 0, 2])).tolist() == [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0], [6.0, 7.0, 8.0]]
    assert emb(torch.tensor(4)).tolist() == [12.0, 13.0, 14.0]  # a 0-d id gives one vector
    assert emb(torch.tensor([[4], [1]])).tolist() == [[[12.0, 13.0, 14.0]], [[3.0, 4.0, 5.0]]]
    assert emb(torch.tensor([0, 4])).tolist() == [[0.0, 1.0, 2.0], [12.0, 13.0, 14.0]]  # both ends of the range


def test_equals_one_hot_times_the_table():
    emb = Embedding(7, 4, dtype=torch.float64)
    ids = torch.tensor([[6, 0, 3], [3, 3, 1]])
    one_hot = F.one_hot(ids, 7).double()
    torch.testing.assert_close(emb(ids), one_hot @ emb.weight)


@pytest.mark.parametrize("id_dtype", INTEGER_DTYPES, ids=str)
def test_every_integer_dtype_is_an_id_not_a_mask(id_dtype):
    emb = Embedding(4, 3)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(12.0).reshape(4, 3))
    # As a mask, [1, 1, 0, 3] would select rows 0, 1, 3; as ids it is rows 1, 1, 0, 3.
    out = emb(torch.tensor([1, 1, 0, 3]).to(id_dtype))
    assert out.tolist() == [[3.0, 4.0, 5.0], [3.0, 4.0, 5.0], [0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]


@pytest.mark.parametrize("device", DEVICES)
def test_ids_may_be_int32_on_any_device(device):
    emb = Embedding(10, 4, device=device)
    ids = torch.tensor([[9, 0], [5, 5]], device=device)
    assert torch.equal(emb(ids.int()), emb(ids))


@pytest.mark.parametrize("leading", [(0,), (2, 0), (0, 3)], ids=str)
def test_empty_ids_give_an_empty_output(leading):
    out = Embedding(5, 3)(torch.empty(leading, dtype=torch.long))
    assert out.shape == (*leading, 3)


def test_output_is_a_copy_not_a_view_of_the_table():
    emb = hand_table()
    with torch.no_grad():
        emb(torch.tensor(2)).zero_()  # plain indexing with a 0-d id would return a view of row 2
        emb(torch.tensor([1, 1])).zero_()
    assert emb.weight[2].tolist() == [6.0, 7.0, 8.0] and emb.weight[1].tolist() == [3.0, 4.0, 5.0]


def test_gradient_reaches_only_looked_up_rows_and_accumulates():
    emb = hand_table()
    emb(torch.tensor([3, 1, 3, 3])).sum().backward()
    # By hand: row 3 looked up three times gets 1 + 1 + 1, row 1 once gets 1, the others nothing.
    assert emb.weight.grad.tolist() == [[0.0] * 3, [1.0] * 3, [0.0] * 3, [3.0] * 3, [0.0] * 3]


def test_backward_sums_the_upstream_rows_of_each_id():
    emb = Embedding(4, 2, dtype=torch.float64)
    upstream = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]], dtype=torch.float64)
    (emb(torch.tensor([2, 0, 2])) * upstream).sum().backward()
    assert emb.weight.grad.tolist() == [[10.0, 20.0], [0.0, 0.0], [101.0, 202.0], [0.0, 0.0]]


def test_gradcheck_weight():
    emb = Embedding(6, 3, dtype=torch.float64)
    ids = torch.tensor([[0, 5, 2], [2, 2, 4]])
    weight = emb.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda w: functional_call(emb, {"weight": w}, (ids,)), (weight,))


def test_parameter_names_and_shape():
    emb = Embedding(11, 5)
    assert [(name, tuple(p.shape)) for name, p in emb.named_parameters()] == [("weight", (11, 5))]
    assert list(emb.state_dict()) == ["weight"]
    assert (emb.num_embeddings, emb.embedding_dim) == (11, 5)
    assert "num_embeddings=11, embedding_dim=5" in repr(emb)


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("meta", id="meta")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_device_and_dtype_are_honoured(device, dtype):
    emb = Embedding(6, 4, device=device, dtype=dtype)
    assert emb.weight.device.type == device and emb.weight.dtype == dtype


def test_loads_a_torch_nn_embedding_state_dict():
    reference = torch.nn.Embedding(9, 4)
    emb = Embedding(9, 4)
    emb.load_state_dict(reference.state_dict(), strict=True)
    ids = torch.tensor([[8, 0, 3]])
    assert torch.equal(emb(ids), reference(ids))


@pytest.mark.parametrize("shape", [(8192, 256), (1000, 3000)], ids=str)
def test_init_statistics(shape):
    torch.manual_seed(1)
    w = Embedding(*shape).weight.detach().double()
    n = w.numel()
    assert abs(w.mean().item()) < 5 / math.sqrt(n)  # five standard errors
    assert w.std().item() == pytest.approx(TRUNCATED_STD, abs=0.003)
    assert w.abs().max().item() <= 3.0  # truncated at ±3 …
    # … and not at some tighter bound: the share beyond 2 matches the truncated normal's 4.29 %.
    beyond_2 = (w.abs() > 2).double().mean().item()
    expected = (math.erf(3 / math.sqrt(2)) - math.erf(2 / math.sqrt(2))) / math.erf(3 / math.sqrt(2))
    assert beyond_2 == pytest.approx(expected, abs=0.002)


def test_two_tables_start_different():
    assert not torch.equal(Embedding(8, 4).weight, Embedding(8, 4).weight)


@pytest.mark.parametrize(
    "bad, dtype_name",
    [(torch.tensor([1.0, 2.0]), "torch.float32"), (torch.tensor([1.0], dtype=torch.float64), "torch.float64"),
     (torch.tensor([True, False]), "torch.bool"), (torch.tensor([1 + 0j]), "torch.complex64")],
    ids=["float32", "float64", "bool", "complex"],
)
def test_non_integer_ids_are_refused_naming_the_dtype(bad, dtype_name):
    with pytest.raises(TypeError, match=rf"integer token ids.*got a tensor of dtype {dtype_name}"):
        Embedding(5, 3)(bad)


def test_bool_ids_error_explains_the_mask():
    with pytest.raises(TypeError, match="mask"):
        Embedding(5, 3)(torch.tensor([True, False, True, True, False]))


@pytest.mark.parametrize("bad", [[1, 2], 3, None], ids=["list", "int", "None"])
def test_non_tensor_ids_are_refused(bad):
    with pytest.raises(TypeError):
        Embedding(5, 3)(bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "ids, found, n_bad",
    [([2, -1], "from -1 to 2", "1 of 2"), ([[5, 0], [1, 2]], "from 0 to 5", "1 of 4"),
     ([-3, 7, 4, 0], "from -3 to 7", "2 of 4"), ([-100], "from -100 to -100", "1 of 1")],
    ids=["negative", "too-large", "both", "ignore-index"],
)
def test_out_of_range_ids_name_what_was_found_and_the_valid_range(device, ids, found, n_bad):
    message = rf"must be in \[0, 4\] \(num_embeddings=5\), got ids {found}: {n_bad} out of range"
    with pytest.raises(ValueError, match=message):
        Embedding(5, 3, device=device)(torch.tensor(ids, device=device))


def test_out_of_range_check_happens_after_conversion_to_int64():
    # 255 as uint8 is the id 255, not -1: out of range for V = 5, but reported as 255.
    with pytest.raises(ValueError, match="from 1 to 255"):
        Embedding(5, 3)(torch.tensor([1, 255], dtype=torch.uint8))
    assert Embedding(300, 2)(torch.tensor([255], dtype=torch.uint8)).shape == (1, 2)


@pytest.mark.parametrize("sizes", [(0, 3), (3, 0), (-1, 2)])
def test_non_positive_sizes_are_refused(sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        Embedding(*sizes)
