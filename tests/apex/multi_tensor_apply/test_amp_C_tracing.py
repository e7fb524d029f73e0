"""amp_C's ops under torch.compile, torch.export and the meta device: the Meta kernel is the op
function's own argument checks (opcheck agrees with the real kernels), and graphs hold the ops."""
import pytest
import torch
from torch.library import opcheck

from apex._ops import ops

CHUNK = 2048 * 32
OPS = ops("amp_C")  # torch.ops.apex, with amp_C's library loaded


def lists(count, sizes=(5, 33, 2), dtype=torch.float32, device="cpu", seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(sizes[i % len(sizes)], generator=generator).to(dtype=dtype, device=device)
             for i in range(len(sizes))] for _ in range(count)]


def flag(device="cpu"):
    return torch.zeros(1, dtype=torch.int32, device=device)


def scalar(value, device="cpu"):
    return torch.tensor([value], dtype=torch.float32, device=device)


def positive(tensors):
    return [t.abs() + 0.1 for t in tensors]


def cases(device):
    """(op, args) for every amp_C op, on `device`."""
    g, p, m, v = lists(4, device=device)
    v = positive(v)
    grad_avgs, updates = lists(2, device=device, seed=3)
    steps = torch.full((3,), 3.0, device=device)
    half_g, half_p = lists(2, dtype=torch.float16, device=device)
    norms = torch.ones(3, device=device)
    return {
        "scale": (OPS.multi_tensor_scale, (CHUNK, flag(device), g, m, 0.5)),
        "axpby": (OPS.multi_tensor_axpby, (CHUNK, flag(device), half_g, g, m, 2.0, -1.0, -1)),
        "l2norm": (OPS.multi_tensor_l2norm, (CHUNK, flag(device), g, True)),
        "l2norm_mp": (OPS.multi_tensor_l2norm_mp, (CHUNK, flag(device), g, False)),
        "l2norm_scale": (OPS.multi_tensor_l2norm_scale, (CHUNK, flag(device), g, m, 0.5, True)),
        "unscale_l2norm": (OPS.multi_tensor_unscale_l2norm, (CHUNK, flag(device), g, scalar(0.25, device), True)),
        "adam": (OPS.multi_tensor_adam, (CHUNK, flag(device), g, p, m, v, 1e-3, 0.9, 0.99, 1e-8, 2, 1, 1, 0.01)),
        "adam_capturable": (OPS.multi_tensor_adam_capturable,
                            (CHUNK, flag(device), g, p, m, v, scalar(1e-3, device), 0.9, 0.99, 1e-8, steps, 1, 1, 0.01,
                             scalar(0.5, device))),
        "adam_capturable_master": (OPS.multi_tensor_adam_capturable_master,
                                   (CHUNK, flag(device), half_g, half_p, m, v, p, scalar(1e-3, device), 0.9, 0.99,
                                    1e-8, steps, 1, 1, 0.01, scalar(1.0, device))),
        "bert_adam": (OPS.multi_tensor_bert_adam,
                      (CHUNK, flag(device), g, p, m, v, 1e-3, 0.9, 0.99, 1e-6, steps, 0.01, 1.0, 1, 0.1, 100.0)),
        "adamp": (OPS.multi_tensor_adamp,
                  (CHUNK, flag(device), g, p, m, v, 1e-3, 0.9, 0.99, 1e-8, steps, 0.01, 0.1, 0.1, False)),
        "sgd": (OPS.multi_tensor_sgd, (CHUNK, flag(device), g, p, m, [], 0.01, 0.9, 0.0, 0.1, False, False, False, 1.0)),
        "lars": (OPS.multi_tensor_lars, (CHUNK, flag(device), g, p, m, [], norms, norms, 0.1, 0.001, 0.0, 0.01, 0.9, 0.0,
                                         False, False, False, 1.0, False)),
        "lamb": (OPS.multi_tensor_lamb, (CHUNK, flag(device), g, p, m, v, 1e-3, 0.9, 0.99, 1e-6, 2, 1, 0.01, 1, 1,
                                         scalar(1.0, device), 1.0, False)),
        "lamb_mp": (OPS.multi_tensor_lamb_mp, (CHUNK, flag(device), g, p, m, v, [], scalar(1e-3, device), 0.9, 0.99,
                                               1e-6, steps, 1, 0.01, 1, 1, scalar(2.0, device), scalar(1.0, device),
                                               False, scalar(0.0, device), scalar(1.0, device))),
        "lamb_step": (OPS.multi_tensor_lamb_step, (CHUNK, flag(device), g, p, m, v, [], scalar(1e-3, device), 0.9,
                                                   0.99, 1e-6, steps, 1, 0.01, 1, 1, scalar(2.0, device),
                                                   scalar(1.0, device), 1, 10.0, scalar(0.0, device),
                                                   scalar(1.0, device))),
        "lamb_direction": (OPS.multi_tensor_lamb_direction, (CHUNK, flag(device), g, p, m, v, updates, 0.9, 0.99, 1e-6,
                                                             steps, 1, 0.01, 1, 0, scalar(2.0, device), 1.0,
                                                             scalar(0.5, device))),
        "novograd": (OPS.multi_tensor_novograd, (CHUNK, flag(device), g, p, m, norms.clone(), 1e-3, 0.9, 0.99, 1e-8, 2,
                                                 1, 0.01, 1, 1, 2)),
        "novograd_step": (OPS.multi_tensor_novograd_step, (CHUNK, flag(device), g, p, m, norms.clone(), 1e-3, 0.9, 0.99,
                                                           1e-8, steps, 1, 0.01, 1, 1, 0)),
        "adagrad": (OPS.multi_tensor_adagrad, (CHUNK, flag(device), g, p, v, 0.1, 1e-10, 0, 0.01)),
        "rmsprop": (OPS.multi_tensor_rmsprop, (CHUNK, flag(device), g, p, v, m, positive(grad_avgs), 1e-3, 0.9, 1e-8,
                                               0.01, 0.9, True, False, False, False)),
        "adadelta": (OPS.multi_tensor_adadelta, (CHUNK, flag(device), g, p, v, positive(m), 1.0, 0.9, 1e-6, 0.01)),
    }


@pytest.mark.parametrize("name", list(cases("cpu")))
def test_every_case_is_on_its_device(name):
    """Each case builds all of its tensors on the device asked for: on the meta device (the op's
    checks alone) a tensor left on the CPU fails the device check, as it would with a CUDA flag."""
    op, args = cases("meta")[name]
    op(*args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", list(cases("cpu")))
def test_opcheck(device, name):
    op, args = cases(device)[name]
    opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_function_calls_the_ops(device, dynamic):
    """A grad-clipping step through norm, scale and Adam, compiled whole, equals the eager one."""
    torch._dynamo.reset()

    def clip_and_step(grads, params, exp_avgs, exp_avg_sqs, found, step):
        total, _ = OPS.multi_tensor_l2norm(CHUNK, found, grads, False)
        OPS.multi_tensor_scale(CHUNK, found, grads, grads, 0.5)
        OPS.multi_tensor_adam_capturable(CHUNK, found, grads, params, exp_avgs, exp_avg_sqs,
                                         torch.full((1,), 1e-3, device=total.device), 0.9, 0.99, 1e-8, step, 1, 1, 0.0,
                                         torch.ones(1, device=total.device))
        return total * 2

    compiled = torch.compile(clip_and_step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for sizes in [(5, 33, 2), (7, 40, 3)]:
        eager_args = [*lists(4, sizes=sizes, device=device), flag(device), torch.ones(1, device=device)]
        eager_args[3] = positive(eager_args[3])
        compiled_args = [[t.clone() for t in a] if isinstance(a, list) else a.clone() for a in eager_args]
        expected = clip_and_step(*eager_args)
        actual = compiled(*compiled_args)
        torch.testing.assert_close(actual, expected)
        for got, want in zip(compiled_args[:4], eager_args[:4]):
            torch.testing.assert_close(got, want)


def test_inductor_compiles_the_norm():
    torch._dynamo.reset()
    compiled = torch.compile(lambda xs, f: OPS.multi_tensor_l2norm(CHUNK, f, xs, True)[1].sum() * 3, fullgraph=True)
    xs = lists(1)[0]
    torch.testing.assert_close(compiled(xs, flag()), torch.stack([x.norm() for x in xs]).sum() * 3)


def test_export_keeps_the_op():
    class Norms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("found_inf", torch.zeros(1, dtype=torch.int32))

        def forward(self, x, y):
            return OPS.multi_tensor_l2norm(CHUNK, self.found_inf, [x, y], True)[1]

    x, y = torch.randn(4, 5), torch.randn(7)
    exported = torch.export.export(Norms(), (x, y))
    assert "multi_tensor_l2norm" in str(exported.graph)
    torch.testing.assert_close(exported.module()(x, y), torch.stack([x.norm(), y.norm()]))


def test_meta_tensors_take_the_checks():
    meta = lists(2, device="meta")
    total, per_tensor = OPS.multi_tensor_l2norm(CHUNK, flag("meta"), meta[0], True)
    assert total.device.type == "meta" and per_tensor.shape == (3,)
    with pytest.raises(RuntimeError, match="tensor 1 of list 1 \\(outputs\\) has 5 elements but list 0 \\(inputs\\) has 33"):
        OPS.multi_tensor_scale(CHUNK, flag("meta"), meta[0], [meta[1][0], meta[1][0], meta[1][2]], 1.0)
    # A tensor left on the meta device fails the device check a real call makes.
    cpu = lists(2)
    cpu[1][1] = cpu[1][1].to("meta")
    with pytest.raises(RuntimeError, match="is on meta but the flag is on cpu"):
        OPS.multi_tensor_scale(CHUNK, flag(), cpu[0], cpu[1], 1.0)
