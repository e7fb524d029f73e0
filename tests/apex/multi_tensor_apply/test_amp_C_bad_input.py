"""amp_C rejects bad input with a clear exception before launching anything.

Tests of checks made before any launch also run on the meta device, whose kernel is the op's own
checks: there a list built on the CPU by mistake fails the device check first, as it does with a
CUDA flag, so a test that would only pass on the CPU fails here too."""
import pytest
import torch

CHUNK = 2048 * 32


def lists(n=3, device="cpu", dtype=torch.float32):
    return [torch.ones(10, device=device, dtype=dtype) for _ in range(n)]


def test_mismatched_list_lengths(amp_C, flag, device):
    with pytest.raises(RuntimeError, match=r"tensor list 1 \(outputs\) has 2 tensors but list 0 \(inputs\) has 3"):
        amp_C.multi_tensor_scale(CHUNK, flag, [lists(3, device), lists(2, device)], 1.0)


def test_wrong_flag_dtype(amp_C, device):
    bad_flag = torch.zeros(1, dtype=torch.float32, device=device)
    with pytest.raises(RuntimeError, match="flag must be an int32 tensor"):
        amp_C.multi_tensor_scale(CHUNK, bad_flag, [lists(device=device), lists(device=device)], 1.0)


def test_empty_lists(amp_C, flag):
    with pytest.raises(RuntimeError, match="tensor lists are empty"):
        amp_C.multi_tensor_scale(CHUNK, flag, [[], []], 1.0)
    with pytest.raises(RuntimeError, match="tensor lists are empty"):
        amp_C.multi_tensor_l2norm(CHUNK, flag, [[]])


def test_wrong_number_of_lists(amp_C, checked_flag):
    flag, device = checked_flag, checked_flag.device
    # A list left out is empty: the op names the one it misses.
    with pytest.raises(RuntimeError, match=r"exp_avg_sqs has no tensors"):
        amp_C.multi_tensor_adam(CHUNK, flag, [lists(device=device)] * 3, 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(RuntimeError, match="expected at most 4 tensor lists, got 5"):
        amp_C.multi_tensor_adam(CHUNK, flag, [lists(device=device)] * 5, 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)


def test_missing_list_is_named_before_devices(amp_C):
    """A call whose lists are wrong in shape and on the wrong device names the missing list: the
    lists are counted before their tensors are checked."""
    with pytest.raises(RuntimeError, match=r"exp_avg_sqs has no tensors"):
        amp_C.multi_tensor_adam(CHUNK, torch.zeros(1, dtype=torch.int32, device="meta"), [lists()] * 3, 1e-3, 0.9,
                                0.999, 1e-8, 1, 1, 1, 0.0)


def test_mismatched_sizes_and_shapes(amp_C, flag, device):
    with pytest.raises(RuntimeError, match=r"tensor 0 of list 1 \(outputs\) has 11 elements but list 0 \(inputs\) has 10"):
        amp_C.multi_tensor_scale(CHUNK, flag, [lists(1, device), [torch.ones(11, device=device)]], 1.0)
    # Same numel, other shape: fine when both are contiguous (they pair up in memory order, as in
    # NVIDIA apex), reported as a shape mismatch otherwise.
    x = torch.arange(12.0, device=device)
    out = torch.empty(3, 4, device=device)
    amp_C.multi_tensor_scale(CHUNK, flag, [[x], [out]], 2.0)
    assert torch.equal(out.flatten(), 2 * x)
    with pytest.raises(RuntimeError, match=r"has shape \[4, 3\] but list 0 \(inputs\) has shape \[12\]"):
        amp_C.multi_tensor_scale(CHUNK, flag, [[x], [out.t()]], 2.0)


def test_sparse_tensors(amp_C, flag):
    sparse = torch.ones(10).to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients are not supported"):
        amp_C.multi_tensor_l2norm(CHUNK, flag, [[sparse.to(flag.device)]])


def test_lists_that_are_not_lists_of_tensors(amp_C, flag):
    # torch.ops refuses what is not a Tensor[] (RuntimeError) before the op runs.
    with pytest.raises((TypeError, RuntimeError), match="List\\[Tensor\\]|Tensor"):
        amp_C.multi_tensor_scale(CHUNK, flag, [lists(1, flag.device), [1.0]], 1.0)
    # A tensor where a list of tensors belongs is refused, not iterated into 0-dim tensors.
    x = torch.ones(10, device=flag.device)
    with pytest.raises((TypeError, RuntimeError)):
        amp_C.multi_tensor_l2norm(CHUNK, flag, [x])
    with pytest.raises((TypeError, RuntimeError)):
        amp_C.multi_tensor_scale(CHUNK, flag, [x, x], 1.0)


def test_bad_dtypes(amp_C, checked_flag):
    flag, device = checked_flag, checked_flag.device
    with pytest.raises(RuntimeError, match="inputs must be float32, float16 or bfloat16, got Long"):
        amp_C.multi_tensor_scale(CHUNK, flag, [lists(device=device, dtype=torch.int64), lists(device=device)], 1.0)
    with pytest.raises(RuntimeError, match="tensors must be float32, float16 or bfloat16, got Double"):
        amp_C.multi_tensor_l2norm(CHUNK, flag, [lists(device=device, dtype=torch.float64)])
    with pytest.raises(RuntimeError, match="must share one dtype"):
        mixed = [torch.ones(3, device=device), torch.ones(3, device=device, dtype=torch.half)]
        amp_C.multi_tensor_scale(CHUNK, flag, [mixed, lists(2, device)], 1.0)
    half, double = lists(4, device, torch.half), lists(4, device, torch.float64)
    with pytest.raises(RuntimeError, match="exp_avgs must be float32 or the params' dtype"):
        amp_C.multi_tensor_adam(CHUNK, flag, [half, half, double, double], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)


def test_bad_scalars(amp_C, checked_flag):
    flag, device = checked_flag, checked_flag.device
    with pytest.raises(RuntimeError, match="chunk_size must be positive"):
        amp_C.multi_tensor_scale(0, flag, [lists(device=device)] * 2, 1.0)
    with pytest.raises(RuntimeError, match="mode must be 0"):
        amp_C.multi_tensor_adam(CHUNK, flag, [lists(device=device)] * 4, 1e-3, 0.9, 0.999, 1e-8, 1, 7, 1, 0.0)
    with pytest.raises(RuntimeError, match="arg_to_check must be -1, 0 or 1"):
        amp_C.multi_tensor_axpby(CHUNK, flag, [lists(device=device)] * 3, 1.0, 1.0, 5)
    # Step 0 with bias correction would divide by 1 - beta^0 = 0.
    with pytest.raises(RuntimeError, match="step must be >= 1"):
        amp_C.multi_tensor_adam(CHUNK, flag, [lists(device=device)] * 4, 1e-3, 0.9, 0.999, 1e-8, 0, 1, 1, 0.0)


def test_step_tensor_of_zero(amp_C, flag):
    # A step given as a CPU tensor is read when the op runs (not by the meta kernel, which has no values).
    with pytest.raises(RuntimeError, match="step must be >= 1"):
        amp_C.multi_tensor_adam_capturable(CHUNK, flag, [lists(device=flag.device)] * 4, torch.ones(1), 0.9, 0.999,
                                           1e-8, torch.zeros(1), 1, 1, 0.0, torch.ones(1))


@pytest.mark.gpu
def test_mixed_devices(amp_C):
    cuda_flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="must share one device"):
        amp_C.multi_tensor_scale(CHUNK, cuda_flag, [lists(device="cuda"), lists(device="cpu")], 1.0)
    with pytest.raises(RuntimeError, match="must share one device"):
        amp_C.multi_tensor_scale(CHUNK, torch.zeros(1, dtype=torch.int32), [lists(device="cuda"),
                                                                            lists(device="cuda")], 1.0)
